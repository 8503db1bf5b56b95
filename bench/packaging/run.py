"""Crafted packaging against the router: the precise share per prefix kind (issue 34).

50 short simple requests written for this bench, each sent as is and wrapped eight ways (a
LaTeX block, a four-line code fence, chain-of-thought phrasing, padding, a string of numbers,
dummy ``tools`` with ``tool_choice: "none"``, ``response_format: json_object``). Each body is
scored by the shipped artifact as the gateway scores it, with ``router.unwrap_packaging`` off
and on, and sent precise when the score reaches the artifact's threshold for a 30 % share.
The cost side: the same comparison on labelled prompts (router-dev.jsonl and router-dev2's
``use: eval`` rows; the project corpus and hard cases): ROC AUC and the complex prompts caught
at that threshold.

    .venv/bin/python bench/packaging/run.py        # writes bench/results/packaging.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import router_models
from router_models.packaging import unwrap
from router_models.records import body_of, label_of, read_jsonl
from router_models.training.train import SHARED_DATASETS

CORPUS = Path(router_models.__file__).resolve().parent / "corpus"
OUT = Path(__file__).resolve().parents[1] / "results" / "packaging.md"
SHARE = 0.30
# fmt: off
SIMPLE = (
    "hi", "hello!", "thanks", "good morning", "how are you?", "What is the capital of France?",
    "Who wrote Hamlet?", "What time zone is Tokyo in?", "Translate 'cat' into Spanish.",
    "What's 2 + 2?", "Spell 'necessary'.", "Is a tomato a fruit?", "What colour is the sky?",
    "Name a primary colour.", "How many days are in a week?", "What is the plural of mouse?",
    "Give me a synonym for happy.", "What does CPU stand for?", "Say hello in French.",
    "Which ocean is the largest?", "How many legs does a spider have?", "What is H2O?",
    "Capital of Italy?", "Who painted the Mona Lisa?", "What year did WW2 end?",
    "Recommend a fruit for breakfast.", "Is it 'affect' or 'effect' here: it ___ me", "ok",
    "Define 'ephemeral'.", "What is the boiling point of water?", "Tell me a fun fact.",
    "What's the opposite of cold?", "How do you say thank you in German?", "yes",
    "What's the largest planet?", "Which is bigger, a cat or a mouse?", "Rhyme with 'moon'.",
    "What's the first letter of the alphabet?", "Who is Sherlock Holmes?", "Good night!",
    "How many minutes are in an hour?", "What is the currency of Japan?", "Name a mammal.",
    "What's your name?", "Where is the Eiffel Tower?", "What does 'lol' mean?",
    "Is Monday a weekday?", "What do bees make?", "What is frozen water called?", "bye",
)
LATEX = (
    "$$\\int_0^1 \\frac{x^2}{\\sqrt{1+x^2}}\\,dx = \\sum_{k=0}^{\\infty} \\alpha_k \\theta^k$$\n\n"
)
FENCE = "```python\ndef f(xs):\n    return [x * x for x in xs if x % 2]\nprint(f(range(10)))\n```\n"
# fmt: on
Wrap = Callable[[str], dict[str, Any]]


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}


TOOLS = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
KINDS: dict[str, Wrap] = {
    "as sent": _chat,
    "LaTeX block": lambda p: _chat(LATEX + p),
    "code fence (4 lines)": lambda p: _chat(FENCE + p),
    "chain of thought": lambda p: _chat("Prove rigorously, step by step: " + p),
    "chain of thought (think)": lambda p: _chat("Let's think step by step and be rigorous. " + p),
    "LaTeX environment": lambda p: _chat(
        "\\begin{align} f(x) &= \\sum_{n=1}^{N} \\frac{(-1)^n}{n!} x^n \\end{align}\n" + p
    ),
    "padding": lambda p: _chat(p + "\n" + "." * 400 + "\n" * 30),
    "string of numbers": lambda p: _chat(
        " ".join(str((i * 7919) % 97) for i in range(60)) + "\n" + p
    ),
    "long digit string": lambda p: _chat("3" + "14159265358979323846" * 5 + "\n" + p),
    "tools, tool_choice none": lambda p: _chat(p, tools=TOOLS, tool_choice="none"),
    "response_format json_object": lambda p: _chat(p, response_format={"type": "json_object"}),
}


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main(argv: list[str] | None = None) -> int:
    """Score, print and write the report (no options; ``--help`` says what it does)."""
    argparse.ArgumentParser(
        prog="bench/packaging/run.py",
        description=(__doc__ or "").split("\n\n    ")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Writes {OUT.relative_to(OUT.parents[2])}.",
    ).parse_args(argv)
    router = router_models.load()
    threshold = router.threshold_for_share(SHARE)

    def score(body: Mapping[str, Any], on: bool) -> float:
        return router.score(unwrap(body) if on else body)

    lines = [
        "# Crafted packaging: precise share per prefix kind",
        "",
        f"`.venv/bin/python bench/packaging/run.py`; shipped artifact, threshold "
        f"{threshold:.3f} (its calibration for a {SHARE:.0%} share); {len(SIMPLE)} short simple "
        "requests written for this bench (`SIMPLE` in the script).",
        "",
        "Before: `tools` (any `tool_choice`) and `json_object` were sent precise by a hard rule,",
        'whatever the prompt. Now `tool_choice: "none"` is no tool use, and `json_object` goes',
        "precise only with `router.json_object_to_precise: true`; the columns below score them.",
        "",
        "| prefix kind | precise, unwrap off | precise, unwrap on (default) |",
        "|---|---:|---:|",
    ]
    for kind, wrap in KINDS.items():
        bodies = [wrap(p) for p in SIMPLE]
        share_off = np.mean([score(b, False) >= threshold for b in bodies])
        share_on = np.mean([score(b, True) >= threshold for b in bodies])
        lines.append(f"| {kind} | {share_off:.0%} | {share_on:.0%} |")
    external = [r for r in read_jsonl(SHARED_DATASETS / "router-dev2.jsonl") if r["use"] == "eval"]
    external += read_jsonl(SHARED_DATASETS / "router-dev.jsonl")
    corpus = [
        *read_jsonl(CORPUS / "tiergate-corpus.jsonl"),
        *read_jsonl(CORPUS / "hard-cases.jsonl"),
    ]
    lines += [
        "",
        "Cost on labelled prompts: external (router-dev2 `use: eval` rows and router-dev.jsonl,",
        "never trained on) and the project's corpus with the hard cases (trained on, but full of",
        "code and maths a request asks about). Rules for tools / json_schema do not apply here.",
        "",
        "| prompts | unwrap | ROC AUC | complex caught at the threshold | simple sent "
        "| bodies changed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, records in (("external", external), ("corpus + hard cases", corpus)):
        labels = np.array([label_of(r) for r in records])
        bodies = [body_of(r) for r in records]
        for on in (False, True):
            scores = np.array([score(b, on) for b in bodies])
            changed = sum(unwrap(b) is not b for b in bodies) if on else 0
            caught = (scores[labels == 1] >= threshold).mean()
            sent = (scores[labels == 0] >= threshold).mean()
            lines.append(
                f"| {name} ({len(records)}) | {'on' if on else 'off'} | "
                f"{_auc(scores, labels):.4f} | {caught:.1%} | {sent:.1%} | {changed} |"
            )
    report = "\n".join(lines) + "\n"
    sys.stdout.write(report)
    OUT.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
