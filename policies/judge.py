"""The judge call of shadow evaluation: the precise tier grades a candidate answer (issue 17).

On a smaller sample than the shadows themselves (``router.shadow.judge_ratio``), the precise
tier is asked, with a fixed rubric, how well the candidate answer (the fast tier's) does
against the reference (the precise tier's) on the user's question. The reply must contain
``SCORE: n`` with ``n`` from 1 to 5; ``parse_score`` maps it onto ``[0, 1]`` and refuses
anything else (an unparseable verdict is counted, never guessed).
"""

from __future__ import annotations

import re
from typing import Final

RUBRIC: Final = (
    "You grade answers. Compare the CANDIDATE answer with the REFERENCE answer to the "
    "QUESTION. Judge only whether the candidate is as correct and complete as the reference, "
    "not its style or length. Scale: 5 = equivalent, 4 = minor omissions, 3 = partly correct, "
    "2 = mostly wrong, 1 = wrong or unrelated. Reply with one line: SCORE: <1-5>."
)
MAX_TOKENS: Final = 16
MAX_PART_CHARS: Final = 4000  # each of question, reference and candidate, clipped
_SCORE: Final = re.compile(r"\bSCORE:\s*([1-5])\b", re.IGNORECASE)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_PART_CHARS else text[:MAX_PART_CHARS] + " [...]"


def judge_messages(question: str, reference: str, candidate: str) -> list[dict[str, str]]:
    """The chat messages of one judge call: the rubric, then the three texts, clipped."""
    content = (
        f"QUESTION:\n{_clip(question)}\n\nREFERENCE:\n{_clip(reference)}\n\n"
        f"CANDIDATE:\n{_clip(candidate)}"
    )
    return [{"role": "system", "content": RUBRIC}, {"role": "user", "content": content}]


def parse_score(reply: str) -> float | None:
    """``SCORE: n`` (1-5) as ``(n - 1) / 4``; None when the reply holds no such verdict."""
    found = _SCORE.search(reply)
    return (int(found.group(1)) - 1) / 4 if found else None
