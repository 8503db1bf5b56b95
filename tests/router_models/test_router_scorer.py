"""Tests for router_models/scorer.py: the lean scorer reproduces scikit-learn exactly."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import router_models
from router_models import scorer
from router_models.artifact import load as load_model
from router_models.corpus.build import DEFAULT_CORPUS, HARD_CASES
from router_models.records import body_of, read_jsonl
from router_models.scorer import LeanScorer, sigmoid
from router_models.training.train import featurize, sklearn_equivalent


def _bodies() -> list[dict[str, Any]]:
    records = read_jsonl(DEFAULT_CORPUS)[:450] + read_jsonl(HARD_CASES)
    bodies = [body_of(r) for r in records]
    bodies += [
        {},
        {"prompt": ""},
        {"prompt": "x" * 20_000},
        {"messages": [{"role": "assistant", "content": "only an assistant turn"}]},
        {"prompt": "naïve café — 東京 ünïcödé 123", "tools": [{}], "max_tokens": 10},
        # material followed by a question (the after-material block), one long line and
        # wrapped prose, and material with nothing after it
        {"prompt": "The river floods every spring. " * 12 + "\nWhen does the river flood?"},
        {"prompt": "\n".join(["Rain fell on the old town all night long."] * 20) + "\nWhy?"},
        {"prompt": "Notes on the plan. " * 40},
    ]
    return bodies


def test_lean_scorer_matches_sklearn_predict_proba() -> None:
    """On hundreds of bodies the lean scorer equals predict_proba to 1e-9 (margins too)."""
    model = load_model(router_models.DEFAULT_ARTIFACT)
    lean = LeanScorer(model)
    clf = sklearn_equivalent(model)
    bodies = _bodies()
    assert len(bodies) >= 500
    x = featurize(bodies)
    expected_p = clf.predict_proba(x)[:, 1]
    expected_m = clf.decision_function(x)
    got_p = np.array([lean.score(b) for b in bodies])
    got_m = np.array([lean.margin(b) for b in bodies])
    assert np.max(np.abs(got_p - expected_p)) <= 1e-9
    assert np.max(np.abs(got_m - expected_m) / np.maximum(1.0, np.abs(expected_m))) <= 1e-9


def test_short_prompts_sum_bigrams_in_python_as_numpy_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bigrams of short instructions are summed in a Python loop, longer ones with numpy: the
    margins agree to 1e-12 with numpy used for every length, on bodies on both sides."""
    model = load_model(router_models.DEFAULT_ARTIFACT)
    bodies = _bodies()
    bodies += [{"prompt": " ".join(f"w{i}" for i in range(n))} for n in range(1, 40)]
    lean = LeanScorer(model)
    margins = [lean.margin(body) for body in bodies]
    monkeypatch.setattr(scorer, "_PYTHON_BIGRAMS", 0)
    numpy_only = LeanScorer(model)
    for body, margin in zip(bodies, margins, strict=True):
        assert margin == pytest.approx(numpy_only.margin(body), abs=1e-12)


def test_word_cache_eviction_does_not_change_scores() -> None:
    """A tiny word cache that keeps clearing itself gives the same scores as a big one."""
    model = load_model(router_models.DEFAULT_ARTIFACT)
    big, tiny = LeanScorer(model), LeanScorer(model, cache_words=3)
    for body in _bodies()[:100]:
        assert tiny.score(body) == pytest.approx(big.score(body), abs=1e-12)


def test_scores_are_probabilities() -> None:
    """Scores lie in [0, 1] and repeated calls are identical."""
    router = router_models.load()
    for body in _bodies()[:50]:
        score = router.score(body)
        assert 0.0 <= score <= 1.0
        assert router.score(body) == score


@pytest.mark.parametrize("margin", [-1000.0, -30.0, 0.0, 30.0, 1000.0])
def test_sigmoid_is_stable_at_extremes(margin: float) -> None:
    """The logistic function neither overflows nor loses symmetry."""
    value = sigmoid(margin)
    assert 0.0 <= value <= 1.0
    assert value + sigmoid(-margin) == pytest.approx(1.0)
    assert not math.isnan(value)


def test_words_met_first_without_material_score_the_same_after_it() -> None:
    """A word cached from a prompt without material gets its after-material weight when it
    is first met after material: same score as a scorer that never saw it before."""
    model = load_model(router_models.DEFAULT_ARTIFACT)
    question = "When does the river flood, and why does it matter?"
    with_material = {"prompt": "The river floods every spring. " * 12 + "\n" + question}
    warm = LeanScorer(model)
    warm.score({"prompt": question})
    assert warm.score(with_material) == pytest.approx(LeanScorer(model).score(with_material))
    clf = sklearn_equivalent(model)
    expected = float(clf.predict_proba(featurize([with_material]))[0, 1])
    assert warm.score(with_material) == pytest.approx(expected, abs=1e-9)


def test_the_word_cache_stays_small_whatever_the_words() -> None:
    """A client sending prompts of distinct very long words (a 3,000-character run of CJK,
    one word to the tokeniser) cannot grow a worker's word cache past its character budget:
    the cache counted entries only, so 50,000 such words could hold about a gigabyte. Scores
    do not depend on what the cache holds."""
    model = load_model(router_models.DEFAULT_ARTIFACT)
    small, plain = LeanScorer(model, cache_chars=10_000), LeanScorer(model)
    assert scorer.DEFAULT_CACHE_CHARS <= 1_000_000
    for i in range(12):
        body = {"messages": [{"role": "user", "content": f"hi {chr(0x20000 + i) * 3_000}"}]}
        assert small.score(body) == plain.score(body)
        words, chars = small.cache_size
        assert chars <= 10_000
        assert words >= 1
    assert plain.cache_size[1] > 30_000  # the default budget keeps them all
