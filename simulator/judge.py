"""The simulator answers the gateway's judge call (``policies/judge.py``, issue 35 item 4).

A chat whose system message is exactly the judge ``RUBRIC`` is graded, not answered: the
reply is one line ``SCORE: n``, a deterministic function of the REFERENCE and CANDIDATE texts
of the user message (the layout of ``judge_messages``):

* the two texts equal after whitespace normalisation: 5;
* otherwise by the Jaccard overlap of their lower-cased word sets: at least 0.75 -> 4,
  at least 0.5 -> 3, at least 0.25 -> 2, below -> 1 (four equal bands, fixed before any run).

A rubric chat whose user message lacks the REFERENCE or CANDIDATE part gets an ordinary reply
(the gateway then counts the verdict ``unparsed``).
"""

from __future__ import annotations

from policies.judge import RUBRIC

BANDS = ((0.75, 4), (0.5, 3), (0.25, 2))  # Jaccard lower bound -> score; below all: 1
_REFERENCE, _CANDIDATE = "\n\nREFERENCE:\n", "\n\nCANDIDATE:\n"


def grade(reference: str, candidate: str) -> int:
    """The rubric score (1-5) of ``candidate`` against ``reference``."""
    if reference.split() == candidate.split():
        return 5
    a, b = set(reference.lower().split()), set(candidate.lower().split())
    overlap = len(a & b) / len(a | b)
    return next((score for bound, score in BANDS if overlap >= bound), 1)


def verdict(system: str, user: str) -> str | None:
    """``SCORE: n`` when ``system`` is the rubric and ``user`` holds both answers, else None."""
    if system != RUBRIC:
        return None
    head, found, candidate = user.rpartition(_CANDIDATE)
    _, found_too, reference = head.rpartition(_REFERENCE)
    if not (found and found_too):
        return None
    return f"SCORE: {grade(reference, candidate)}"
