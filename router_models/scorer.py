"""The lean scorer: the trained linear model compiled for the request path.

No scikit-learn here.  The calibrated model ``p = sigmoid(a·(w·x + b) + c)`` is folded into
one weight vector at load time.  Because every n-gram block is a sum over tokens scaled by a
per-block factor, the scorer keeps a per-word cache of each token's hash, its unigram plus
character n-gram weight, and its edge weight; scoring a prompt is then tokenisation, one dict
lookup per token, a vectorised gather for the bigrams, a handful of regex counts for the
structural signals, and a sigmoid.  Tests check it against scikit-learn's ``predict_proba``
to 1e-9.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, Final, cast

import numpy as np

from router_models.artifact import FloatArray, RouterModel
from router_models.features import (
    AFTER_WEIGHT,
    BIGRAM_ADD,
    BIGRAM_MUL_A,
    BIGRAM_MUL_B,
    CHAR_WEIGHT,
    EDGE_TOKENS,
    HASH_SHIFT,
    HASH_SIZE,
    MASK32,
    MATERIAL_WEIGHT,
    after_indices,
    bigram_index,
    char_indices,
    edge_index,
    material_index,
    parts_of,
    render,
    structural,
    token_class,
    word_hash,
)

DEFAULT_CACHE_WORDS: Final = 50_000  # about 10 MB of entries; cleared (not LRU) when full
# The cache's words together hold at most this many characters (a few MB): a Chinese clause is
# one word, and a client sending distinct 4,000-character words could otherwise fill the 50,000
# entries with about a gigabyte.
DEFAULT_CACHE_CHARS: Final = 1_000_000
# Up to this many tokens, bigrams are summed in a Python loop: numpy's fixed cost per call
# (about 4.5 µs here) is more than the loop's (0.16 µs a bigram); they break even near 32.
_PYTHON_BIGRAMS: Final = 24
_MUL_A: Final = np.uint64(BIGRAM_MUL_A)
_MUL_B: Final = np.uint64(BIGRAM_MUL_B)
_ADD: Final = np.uint64(BIGRAM_ADD)
_MASK: Final = np.uint64(MASK32)
_SHIFT: Final = np.uint64(HASH_SHIFT)

# (token hash, unigram weight + CHAR_WEIGHT * summed char n-gram weights, edge weight,
#  structural class, MATERIAL_WEIGHT * material-unigram weight,
#  AFTER_WEIGHT * the same word's weight as an instruction word after material, or NaN until
#  the word is first met there: most words never are, and it costs a second set of character
#  n-gram hashes)
WordEntry = tuple[int, float, float, str, float, float]
_HASH, _WORD, _EDGE, _CLASS, _MATERIAL, _AFTER = (operator.itemgetter(i) for i in range(6))


def sigmoid(margin: float) -> float:
    """Numerically safe logistic function."""
    if margin >= 0:
        return 1.0 / (1.0 + math.exp(-margin))
    e = math.exp(margin)
    return e / (1.0 + e)


class LeanScorer:
    """Scores request bodies with a folded linear model; safe to share across requests."""

    def __init__(
        self,
        model: RouterModel,
        cache_words: int = DEFAULT_CACHE_WORDS,
        cache_chars: int = DEFAULT_CACHE_CHARS,
    ) -> None:
        dense, bias = model.folded_weights()
        self._hashed: FloatArray = dense[:HASH_SIZE].copy()
        self._hashed_list: list[float] = self._hashed.tolist()
        self._structural: list[float] = dense[HASH_SIZE:].tolist()
        self._bias = bias
        self._cache: dict[str, WordEntry] = {}
        self._cache_words = cache_words
        self._cache_chars = cache_chars
        self._cached_chars = 0  # the characters of the cached words

    def _entry(self, token: str, after_material: bool = False) -> WordEntry:
        w = self._hashed_list
        h = word_hash(token)
        chars = char_indices(token)
        word = w[h >> HASH_SHIFT] + CHAR_WEIGHT * math.fsum(w[i] for i in chars)
        material = MATERIAL_WEIGHT * w[material_index(token)]
        after = math.nan
        if after_material:
            after_word, after_chars = after_indices(token)
            after = AFTER_WEIGHT * (
                w[after_word] + CHAR_WEIGHT * math.fsum(w[i] for i in after_chars)
            )
        entry = (h, word, w[edge_index(token)], token_class(token), material, after)
        held = self._cached_chars + len(token)
        if len(self._cache) >= self._cache_words or held > self._cache_chars:
            self._cache.clear()
            held = len(token)
        self._cache[token] = entry
        self._cached_chars = held
        return entry

    @property
    def cache_size(self) -> tuple[int, int]:
        """The word cache's size: words, and their characters together."""
        return len(self._cache), self._cached_chars

    def _entries(self, tokens: list[str], after_material: bool = False) -> list[WordEntry]:
        """The cache entries of ``tokens`` (one C-level pass when every word is cached)."""
        found: list[WordEntry | None] = list(map(self._cache.get, tokens))
        # Entries are non-empty tuples: all() tests truth (a length check), where ``None in``
        # would call each tuple's comparison with None.
        if not all(found):
            get = self._cache.get
            return [get(t) or self._entry(t, after_material) for t in tokens]
        return cast("list[WordEntry]", found)  # no None left

    def _after_sum(self, tokens: list[str], entries: list[WordEntry]) -> float:
        """Summed after-material weights of the instruction ``tokens`` (``entries`` are
        their cache entries; words not yet met after material get their weight now)."""
        total: float = sum(map(_AFTER, entries))
        if math.isnan(total):
            total = 0.0
            for token, entry in zip(tokens, entries, strict=True):
                value = entry[5]
                if math.isnan(value):  # met before, not after material: look again, then fill
                    value = self._cache.get(token, entry)[5]
                    if math.isnan(value):
                        value = self._entry(token, after_material=True)[5]
                total += value
        return total

    def _bigram_sum(self, entries: list[WordEntry]) -> float:
        n = len(entries)
        if n < 2:
            return 0.0
        if n <= _PYTHON_BIGRAMS:
            w = self._hashed_list
            hashes: list[int] = list(map(_HASH, entries))
            total: float = sum([w[i] for i in map(bigram_index, hashes, hashes[1:])])
            return total
        arr = np.fromiter(map(_HASH, entries), dtype=np.uint64, count=n)
        idx = ((arr[:-1] * _MUL_A + arr[1:] * _MUL_B + _ADD) & _MASK) >> _SHIFT
        return float(self._hashed[idx].sum())

    def margin(self, body: Mapping[str, Any]) -> float:
        """Calibrated log-odds that ``body`` needs the precise tier."""
        rendered = render(body)
        parts, m_tokens, i_tokens = parts_of(rendered.text)
        total = self._bias
        classes = ""
        if m_tokens:
            m_entries = self._entries(m_tokens)
            classes = "".join(map(_CLASS, m_entries))
            total += sum(map(_MATERIAL, m_entries)) / math.sqrt(len(m_entries))
        entries = self._entries(i_tokens, after_material=bool(m_tokens))
        if entries:
            classes += "".join(map(_CLASS, entries))
            word_sum = sum(map(_WORD, entries)) + self._bigram_sum(entries)
            if m_tokens:
                word_sum += self._after_sum(i_tokens, entries)
            total += word_sum / math.sqrt(len(entries))
            if len(entries) > 2 * EDGE_TOKENS:
                edge = sum(map(_EDGE, entries[:EDGE_TOKENS])) + sum(
                    map(_EDGE, entries[-EDGE_TOKENS:])
                )
                total += edge / math.sqrt(2 * EDGE_TOKENS)
            else:
                total += sum(map(_EDGE, entries)) / math.sqrt(len(entries))
        signals = structural(rendered, len(m_tokens) + len(i_tokens), classes, parts)
        weighted: float = sum(map(operator.mul, signals, self._structural))
        return total + weighted

    def score(self, body: Mapping[str, Any]) -> float:
        """Probability that ``body`` needs the precise tier."""
        return sigmoid(self.margin(body))
