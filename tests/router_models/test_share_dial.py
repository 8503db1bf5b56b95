"""The share dial on traffic the router was not trained on: the online controller (with the
gateway's tuning, ``policies.dial.dial_config``) holds the precise share within 3 points of
the target at 10 %, 25 % and 50 % complex traffic; a fresh one holds it after 500 requests, and
a dial turned live holds the new target at once (warm start from the window)."""

from __future__ import annotations

import numpy as np
import pytest

import router_models
from policies.dial import dial_config
from policies.threshold import ShareController
from router_models.records import body_of, label_of, read_jsonl
from tests.shared_data import SHARED_DATASETS, needs_shared

pytestmark = needs_shared("datasets/router-dev.jsonl", "datasets/router-dev2.jsonl")
TARGET = 0.30
REQUESTS = 15_000
WARM_UP = 5_000  # requests before the share is judged (min_samples 1,000 + bounded steps)
BLOCK = 2_500


@pytest.fixture(scope="module")
def external_scores() -> tuple[np.ndarray, np.ndarray]:
    """Shipped-artifact scores of every external prompt it was not trained on."""
    records = [r for r in read_jsonl(SHARED_DATASETS / "router-dev2.jsonl") if r["use"] == "eval"]
    records += read_jsonl(SHARED_DATASETS / "router-dev.jsonl")
    router = router_models.load()
    scores = np.array([router.score(body_of(r)) for r in records])
    labels = np.array([label_of(r) for r in records])
    return scores[labels == 1], scores[labels == 0]


def _stream(
    complex_share: float, scores: tuple[np.ndarray, np.ndarray], seed: int, n: int = REQUESTS
) -> list[float]:
    complex_scores, simple_scores = scores
    rng = np.random.default_rng(seed)
    is_complex = rng.random(n) < complex_share
    stream = np.where(is_complex, rng.choice(complex_scores, n), rng.choice(simple_scores, n))
    return [float(s) for s in stream]


def _feed(controller: ShareController, stream: list[float]) -> np.ndarray:
    sent = np.zeros(len(stream), dtype=bool)
    for i, score in enumerate(stream):
        sent[i] = controller.decide(score)
        controller.observe(bool(sent[i]), score)
    return sent


def _run(complex_share: float, scores: tuple[np.ndarray, np.ndarray], seed: int) -> np.ndarray:
    router = router_models.load()
    controller = ShareController(dial_config(TARGET), router.threshold_for_share(TARGET))
    return _feed(controller, _stream(complex_share, scores, seed))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("complex_share", [0.10, 0.25, 0.50])
def test_online_dial_holds_the_share(
    complex_share: float, seed: int, external_scores: tuple[np.ndarray, np.ndarray]
) -> None:
    """After the warm-up the observed precise share is within 3 points of the target, for
    several draws of the traffic (one draw hid a dead band that let it settle at the edge)."""
    sent = _run(complex_share, external_scores, seed=int(complex_share * 100) + 1000 * seed)
    judged = sent[WARM_UP:]
    assert abs(judged.mean() - TARGET) <= 0.03, judged.mean()
    blocks = judged.reshape(-1, BLOCK).mean(axis=1)
    assert np.all(np.abs(blocks - TARGET) <= 0.045), blocks


def test_fixed_threshold_alone_does_not_hold(
    external_scores: tuple[np.ndarray, np.ndarray],
) -> None:
    """Why the controller is on by default: the artifact's fixed threshold misses on this mix."""
    complex_scores, simple_scores = external_scores
    threshold = router_models.load().threshold_for_share(TARGET)
    share = 0.5 * (complex_scores >= threshold).mean() + 0.5 * (simple_scores >= threshold).mean()
    assert abs(share - TARGET) > 0.03


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("complex_share", [0.10, 0.50])
def test_a_fresh_dial_holds_after_500_requests(
    complex_share: float, seed: int, external_scores: tuple[np.ndarray, np.ndarray]
) -> None:
    """A first-day gateway: from request 500 on, the next 2,000 are within 3 points of target
    (the warm start jumps to the young window's quantile instead of waiting 5,000 requests)."""
    router = router_models.load()
    controller = ShareController(dial_config(TARGET), router.threshold_for_share(TARGET))
    sent = _feed(controller, _stream(complex_share, external_scores, 7 + seed, 2_500))
    print(f"fresh, {complex_share:.0%} complex: {sent[500:].mean():.3f}")
    assert abs(sent[500:].mean() - TARGET) <= 0.03, sent[500:].mean()


@pytest.mark.parametrize("new_target", [0.15, 0.25, 0.45])
def test_a_turned_dial_holds_the_new_target_at_once(
    new_target: float, external_scores: tuple[np.ndarray, np.ndarray]
) -> None:
    """A warm controller turned to a new target: the next 500 requests, and the 2,000 after,
    are within 3 points of the new target (it re-aims on its window's scores)."""
    router = router_models.load()
    controller = ShareController(dial_config(TARGET), router.threshold_for_share(TARGET))
    _feed(controller, _stream(0.25, external_scores, 11, 6_000))
    controller.retarget(new_target, router.threshold_for_share(new_target))
    sent = _feed(controller, _stream(0.25, external_scores, 12, 2_500))
    print(
        f"turned to {new_target}: first 500 {sent[:500].mean():.3f}, then {sent[500:].mean():.3f}"
    )
    assert abs(sent[:500].mean() - new_target) <= 0.03, sent[:500].mean()
    assert abs(sent[500:].mean() - new_target) <= 0.03, sent[500:].mean()
