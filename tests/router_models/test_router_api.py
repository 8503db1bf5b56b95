"""Tests for the embedding API in router_models/__init__.py."""

from __future__ import annotations

import itertools

import pytest

import router_models

HARD = {"messages": [{"role": "user", "content": "Prove that there are infinitely many primes."}]}
EASY = {"messages": [{"role": "user", "content": "hi! how are you today?"}]}


def test_load_default_and_score_chat_and_completion_bodies() -> None:
    """The shipped router scores chat and completion bodies on the right side of 0.5."""
    router = router_models.load()
    assert router.score({"prompt": "Write a function to find the nth Bell number."}) > 0.5
    assert router.score({"prompt": "what's the capital of france"}) < 0.5


@pytest.mark.xfail(
    strict=True,
    reason="known regression of the issue-35 artifact: a bare proof request scores 0.180, "
    "small talk 0.190 (v7: 0.385 / 0.234); docs/router.md, 'Issue 35'",
)
def test_bare_proof_request_ranks_above_small_talk() -> None:
    """A proof request with no maths symbols should rank above small talk (it does not)."""
    router = router_models.load()
    assert router.score(HARD) > router.score(EASY)


def test_load_accepts_str_and_path() -> None:
    """``load`` takes a string or a Path to an artifact."""
    a = router_models.load(str(router_models.DEFAULT_ARTIFACT))
    b = router_models.load(router_models.DEFAULT_ARTIFACT)
    assert a.score(HARD) == b.score(HARD)


def test_metadata_describes_the_artifact() -> None:
    """Metadata carries version, data digest, feature set and the default threshold."""
    meta = router_models.load().metadata
    for key in (
        "model_version",
        "data_digest",
        "feature_spec",
        "default_threshold",
        "default_target_share",
        "reference",
        "version",
    ):
        assert key in meta
    assert meta["data_digest"].startswith("sha256:")


def test_tier_uses_default_or_given_threshold() -> None:
    """``tier`` compares the score with the default threshold unless one is given."""
    router = router_models.load()
    assert router.tier(HARD, threshold=0.0) == router_models.PRECISE
    assert router.tier(HARD, threshold=1.1) == router_models.FAST
    assert router.tier(EASY) == router_models.FAST


def test_threshold_for_share_from_reference_and_sample() -> None:
    """The dial interpolates the reference quantiles, or uses a caller's sample exactly."""
    router = router_models.load()
    shares = [0.0, 0.1, 0.3, 0.5, 0.9, 1.0]
    thresholds = [router.threshold_for_share(s) for s in shares]
    assert all(a >= b for a, b in itertools.pairwise(thresholds))
    sample = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert router.threshold_for_share(0.3, sample) == 0.8
    with pytest.raises(ValueError, match="share"):
        router.threshold_for_share(1.5)
