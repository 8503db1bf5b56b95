"""The simulator answers the gateway's judge call (``policies/judge.py``, issue 35 item 4).

A chat whose system message is exactly the judge ``RUBRIC`` is graded, not answered: the
reply is one line ``SCORE: n``, a deterministic function of the REFERENCE and CANDIDATE texts
of the user message (the layout of ``judge_messages``):

* the two texts equal after whitespace normalisation: 5;
* otherwise by how much of the two token sequences match, in order (``difflib``'s ratio,
  ``2 * matched / (len(a) + len(b))``, no junk heuristic): at least 0.75 -> 4, at least 0.5 -> 3,
  at least 0.25 -> 2, below -> 1. Tokens are lower-cased words and, in scripts written without
  spaces (Chinese, Japanese), single characters, so a near match there is graded like one in
  English. The first version compared word *sets* (Jaccard): two different long answers drawn
  from the simulator's small vocabulary shared nearly every word and were graded 4, and an
  unspaced sentence was one word, so any difference graded 1
  (``tests/simulator/test_judge_attack.py``).

A rubric chat whose user message lacks the REFERENCE or CANDIDATE part gets an ordinary reply
(the gateway then counts the verdict ``unparsed``). The reference runs from the first
REFERENCE marker to the last CANDIDATE marker, so a marker inside the reference does not cut
it; one inside the question or the candidate still does (the layout cannot tell them apart).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

from policies.judge import RUBRIC

BANDS = ((0.75, 4), (0.5, 3), (0.25, 2))  # matched share lower bound -> score; below all: 1
_REFERENCE, _CANDIDATE = "\n\nREFERENCE:\n", "\n\nCANDIDATE:\n"
# A run of letters, digits or underscores in a spaced script, or any other single character
# that is not a space (a CJK character, a kana, a punctuation mark).
_TOKEN = re.compile(r"[^\W\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+|\S")


def tokens(text: str) -> list[str]:
    """Lower-cased words, and single characters of Chinese, Japanese and Korean text."""
    return _TOKEN.findall(text.lower())


def grade(reference: str, candidate: str) -> int:
    """The rubric score (1-5) of ``candidate`` against ``reference``."""
    if reference.split() == candidate.split():
        return 5
    a, b = tokens(reference), tokens(candidate)
    matched = SequenceMatcher(None, a, b, autojunk=False).ratio() if a or b else 1.0
    return next((score for bound, score in BANDS if matched >= bound), 1)


def verdict(system: str, user: str) -> str | None:
    """``SCORE: n`` when ``system`` is the rubric and ``user`` holds both answers, else None."""
    if system != RUBRIC:
        return None
    _, found, rest = user.partition(_REFERENCE)
    reference, found_too, candidate = rest.rpartition(_CANDIDATE)
    if not (found and found_too):
        return None
    return f"SCORE: {grade(reference, candidate)}"
