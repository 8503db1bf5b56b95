"""Step-count signals (round 12 candidate, off by default): how many steps, not how many numbers.

A one-step problem and a multi-step one can carry the same numbers; what differs is how many
clauses introduce a quantity, and whether the wording chains them ("then", "each", "remaining",
然后 / 每 / 剩, その後 / ずつ / 残り) or asks for one operation on two of them ("how many more",
多多少, 少ない).  Everything here works on the per-token class string that the lean scorer caches
per word (no change to the scorer), so the block costs a few string operations per request:

* ``token_cues(token)`` is ``"C"`` once per chain cue and ``"X"`` once per one-operation ask in
  the token (English words by exact match; Chinese and Japanese cues as substrings, since those
  scripts are tokenised into long runs).  With the block on, ``features.token_class`` appends
  them to the token's one-character class, so the class string carries them;
* ``has_quantity(token)``: a digit inside the token (tokens are digit-folded, so ``0``) or a CJK
  numeral other than 一 (too common as an article), for tokens that do not start with a digit;
* ``step_signals(classes, option_lines, numeric_options)``: the block, in ``STEP_NAMES``
  order.  Clauses are the runs of token classes between sentence, question and clause
  punctuation; each numeric option line (``A. 24``) adds one numeric clause, so those
  are taken off.

The cue lists were written once, before the measurement (docs/router.md, "Round 12").
"""

from __future__ import annotations

import math
from typing import Final

STEP_NAMES: Final = (
    "log_quantity_clauses",
    "quantity_clause_share",
    "log_chain_cues",
    "log_compare_cues",
    "few_steps",
)
# Cue marks (upper case: no token class uses them, so no other count sees them).
CHAIN: Final = "C"
COMPARE: Final = "X"
# Token classes this block adds (features.token_class uses them only when the block is on):
# a token with a quantity inside it, and clause punctuation other than "." "!" "?".
CLASS_INNER_NUMBER: Final = "N"
CLASS_CLAUSE: Final = "p"
CLAUSE_TOKENS: Final = frozenset(",;:\u3001\u3002\uff0c\uff1b\uff1a\uff1f\uff01\uff0e")
# fmt: off
_EN_CHAIN: Final = frozenset((
    "then", "after", "afterwards", "later", "remaining", "remainder", "remains", "rest", "each",
    "per", "every", "times", "twice", "thrice", "double", "triple", "half", "again", "another",
))
_EN_COMPARE: Final = frozenset(("more", "fewer", "less", "than", "difference", "change"))
_CJK_CHAIN: Final = (
    "然后", "再", "又", "还", "剩", "余下", "其余", "每", "毎", "倍", "平均", "之后", "以后",
    "接着", "分别", "その後", "それから", "残り", "ずつ", "さらに", "次に", "それぞれ",
)
_CJK_COMPARE: Final = (
    "多多少", "少多少", "相差", "还剩", "找回", "多い", "少ない", "差は", "おつり", "違い",
)
# fmt: on
_CJK_NUMERALS: Final = frozenset("二两兩三四五六七八九十百千万萬半")
# Clause ends (sentence, question, clause punctuation) become "|", quantities "n".
_SEGMENTS: Final = str.maketrans({"s": "|", "q": "|", CLASS_CLAUSE: "|", CLASS_INNER_NUMBER: "n"})


def token_cues(token: str) -> str:
    """``"c"`` per chain cue and ``"x"`` per one-operation ask in ``token``."""
    if token.isascii():
        if token in _EN_CHAIN:
            return CHAIN
        return COMPARE if token in _EN_COMPARE else ""
    chain = sum(token.count(cue) for cue in _CJK_CHAIN)
    compare = sum(token.count(cue) for cue in _CJK_COMPARE)
    return CHAIN * chain + COMPARE * compare


def has_quantity(token: str) -> bool:
    """A digit (folded to ``0``) or a CJK numeral other than 一 inside ``token``."""
    return "0" in token or (not token.isascii() and not _CJK_NUMERALS.isdisjoint(token))


def _log(value: float, scale: float) -> float:
    return math.log1p(value) / scale


def step_signals(classes: str, option_lines: int, numeric_options: int) -> tuple[float, ...]:
    """The step-count block of a text from its class string (classes and cue marks)."""
    segments = classes.translate(_SEGMENTS).split("|")
    quantity_clauses = max(0, sum(["n" in seg for seg in segments]) - numeric_options)
    clauses = max(1, len(segments) - segments.count("") - option_lines)
    chain = classes.count(CHAIN)
    compare = classes.count(COMPARE)
    few = 1.0 if 1 <= quantity_clauses <= 2 and chain == 0 else 0.0
    return (
        _log(quantity_clauses, 2.5),
        min(1.0, quantity_clauses / clauses),
        _log(chain, 2.5),
        _log(compare, 2.0),
        few,
    )
