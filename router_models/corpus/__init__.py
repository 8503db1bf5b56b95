"""The project's own labelled corpus for the tier router.

Everything here was written for TierGate: word banks, templates and hand-written hard cases,
composed by ``build.py`` with a seeded RNG into ``tiergate-corpus.jsonl``.  No prompt is taken
from a public dataset or from the evaluation file.
"""
