"""A replica's speed estimate: learnt from finished answers, decaying toward the others'."""

from __future__ import annotations

import pytest

from gateway.upstream.replicas import SPEED_DOWN, SPEED_MIN_SAMPLES, SPEED_UP, ReplicaPool
from policies.selection import LeastLoaded, slowness

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
MARGIN = 1.5


def pool(half_life_s: float = 10.0) -> ReplicaPool:
    """Two replicas of one tier, never measured."""
    return ReplicaPool("fast", URLS, 4, 0.2, speed_half_life_s=half_life_s)


def answers(p: ReplicaPool, replica_index: int, token_s: float, count: int, now: float) -> None:
    """``count`` streams of 20 decoded tokens at ``token_s`` each."""
    for _ in range(count):
        p.record_speed(p.replicas[replica_index], token_s * 20, 20, now=now)


def test_no_data_means_no_estimate_and_nothing_to_decay() -> None:
    """A replica never measured stays at 0 (the mean, for strategies); decay leaves it there."""
    p = pool()
    fast, slow = p.replicas
    p.record_speed(fast, 1.0, 0, now=1.0)  # no tokens: no sample
    assert fast.token_s == 0.0
    answers(p, 0, 0.01, SPEED_MIN_SAMPLES, now=1.0)
    p.decay_speeds(100.0)  # one speed alone has nothing to decay toward
    assert fast.token_s == pytest.approx(0.01)
    assert slow.token_s == 0.0


def test_answers_move_a_clipped_moving_average() -> None:
    """The first answers are averaged; later ones move the average by SPEED_UP when slower
    and SPEED_DOWN when faster, each at most twice or half the average."""
    p = pool()
    replica = p.replicas[0]
    answers(p, 0, 0.01, 10, now=1.0)
    assert replica.token_s == pytest.approx(0.01)
    answers(p, 0, 0.013, 1, now=2.0)
    assert replica.token_s == pytest.approx(0.01 + SPEED_UP * 0.003)
    answers(p, 0, 1.0, 1, now=3.0)  # clipped to twice the average
    assert replica.token_s == pytest.approx(0.0103 * (1 + SPEED_UP))
    avg = replica.token_s
    answers(p, 0, 0.0001, 1, now=4.0)  # clipped to half
    assert replica.token_s == pytest.approx(avg * (1 - SPEED_DOWN / 2))
    assert replica.token_at == 4.0


def test_an_estimate_without_answers_halves_its_distance_to_the_fastest_per_half_life() -> None:
    """The slow replica, unanswered for one half-life, is halfway to the fastest's speed; the
    fastest does not move, answered or not."""
    p = pool(half_life_s=10.0)
    fast, slow = p.replicas
    answers(p, 1, 0.03, SPEED_MIN_SAMPLES, now=0.0)
    answers(p, 0, 0.01, SPEED_MIN_SAMPLES, now=0.0)
    p.decay_speeds(10.0)
    assert slow.token_s == pytest.approx(0.02)
    assert fast.token_s == pytest.approx(0.01)
    p.decay_speeds(30.0)  # two more half-lives: a quarter of the rest
    assert slow.token_s == pytest.approx(0.0125)
    assert fast.token_s == pytest.approx(0.01)


def simulate(p: ReplicaPool, seconds: float, slow_s: float, start: float = 0.0) -> list[str]:
    """Sequential traffic, one request per health round (0.5 s): who served each one, each
    answering at its true speed (0.01 s a token; the second replica ``slow_s``)."""
    strategy = LeastLoaded(speed_margin=MARGIN)
    fast, slow = p.replicas
    served = []
    steps = int(seconds / 0.5)
    for step in range(steps):
        now = start + 0.5 * step
        replica = strategy.choose(p.replicas, (), step).replica
        p.record_speed(replica, (0.01 if replica is fast else slow_s) * 100, 100, now=now)
        p.decay_speeds(now)
        served.append("slow" if replica is slow else "fast")
    return served


def test_a_slow_replica_is_tried_now_and_then_and_recovers_once_fast() -> None:
    """3x slower, it serves a few of 200 sequential requests (re-tried every half-life or
    two, each time found slow again); once fast again, it is an equal within 7 half-lives
    (a faster answer moves the average by SPEED_DOWN, to half the average at most)."""
    p = pool(half_life_s=10.0)
    slow_phase = simulate(p, 100.0, slow_s=0.03)
    assert 3 <= slow_phase.count("slow") <= 12, slow_phase.count("slow")
    healed = simulate(p, 100.0, slow_s=0.01, start=100.0)
    first_equal = next(i for i in range(len(healed)) if healed[i : i + 4].count("slow") == 2)
    assert first_equal * 0.5 <= 70.0, first_equal
    assert healed[-40:].count("slow") == 20  # equals again: ties alternate


def test_one_outlier_answer_does_not_make_an_equal_replica_slower() -> None:
    """Two equal replicas with a dozen answers each at 10 ms a token; one answer of the
    first at 100 ms a token (a stalled client, a pause) leaves them within the margin."""
    p = pool()
    for step in range(12):
        for replica in p.replicas:
            p.record_speed(replica, 0.01 * 20, 20, now=float(step))
    p.record_speed(p.replicas[0], 0.1 * 20, 20, now=12.0)
    assert slowness(p.replicas, MARGIN) is None, [r.token_s for r in p.replicas]


def test_a_replica_counts_only_after_a_few_answers() -> None:
    """One answer is not an estimate: the replica stays unknown (the mean, for strategies)."""
    p = pool()
    fast, slow = p.replicas
    for step in range(12):
        p.record_speed(fast, 0.01 * 20, 20, now=float(step))
    p.record_speed(slow, 0.05 * 20, 20, now=12.0)
    assert slow.token_s == 0.0
    assert slowness(p.replicas, MARGIN) is None
