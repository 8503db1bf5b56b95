"""Attack on the Unicode tokeniser's digit fold (``_NONZERO_DIGIT_RE.sub`` in place of
``str.translate(_DIGITS)``): the same tokens as the reference fold on every code point,
on characters whose lowercase is longer ('İ' -> 'i̇'), lone surrogates, combining marks and a
1 MB string. It passed when written: the finding was that there is no difference."""

from __future__ import annotations

import sys
from random import Random

from router_models.features import _DIGITS, _TOKEN_RE, tokenize


def reference(text: str) -> list[str]:
    """The tokens with the fold's definition (``str.translate``)."""
    tokens: list[str] = _TOKEN_RE.findall(text.lower().translate(_DIGITS))
    return tokens


def test_every_code_point_folds_like_the_reference() -> None:
    """All 1,114,112 code points in 4,096-character chunks, packed and space-separated, each
    chunk made non-ASCII so the general path runs."""
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    for start in range(0, len(every), 4096):
        for chunk in (every[start : start + 4096], " ".join(every[start : start + 4096])):
            assert tokenize(chunk + "é") == reference(chunk + "é"), start


def test_mixed_strings_and_a_long_one_fold_like_the_reference() -> None:
    """Random mixes of case-changing, digit-like, combining and surrogate characters."""
    pool = "İ\u0131ẞßΣς0123456789\u0661\u0663१¹½Ⅻ\u0301\u0308aZ ,.\ud800\udfff漢字かな"
    rng = Random(1)
    for _ in range(5000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        assert tokenize(text) == reference(text), repr(text)
    long = "İ1漢9 " * 200_000
    assert tokenize(long) == reference(long)
