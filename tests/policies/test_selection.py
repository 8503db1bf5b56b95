"""Replica-selection strategies: round-robin, least-loaded and prefix affinity."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from policies.selection import LeastLoaded, PrefixAffinity, RoundRobin, load_of

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


@dataclass
class Node:
    """An in-memory replica with the fields a strategy may read."""

    url: str
    in_flight: int = 0
    max_concurrency: int = 64
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    token_s: float = 0.0


def nodes() -> list[Node]:
    """Four idle replicas."""
    return [Node(url) for url in URLS]


def keys(n: int, seed: int = 1) -> list[tuple[int, ...]]:
    """``n`` random prefix keys (two chained blocks each)."""
    rng = random.Random(seed)
    return [(rng.getrandbits(64), rng.getrandbits(64)) for _ in range(n)]


def test_round_robin_cycles() -> None:
    """Round-robin takes each candidate in turn."""
    pool = nodes()
    picks = [RoundRobin().choose(pool, (), tick).replica.url for tick in range(8)]
    assert picks == URLS + URLS


def test_load_is_the_larger_of_own_and_reported() -> None:
    """Load counts what the replica reports (other gateways) or our own in-flight, not both."""
    assert load_of(Node("a", in_flight=3, running=2, waiting=0)) == 3
    assert load_of(Node("a", in_flight=1, running=5, waiting=4)) == 9


def test_least_loaded_picks_the_minimum() -> None:
    """Least-loaded picks the replica with the smallest load."""
    pool = nodes()
    pool[0].in_flight, pool[1].in_flight, pool[2].waiting, pool[3].in_flight = 4, 2, 5, 1
    assert LeastLoaded().choose(pool, (), 0).replica is pool[3]


def test_least_loaded_ties_spread_with_the_tick() -> None:
    """Equal loads are broken by the tick so idle replicas share the work."""
    pool = nodes()
    picks = {LeastLoaded().choose(pool, (), tick).replica.url for tick in range(4)}
    assert picks == set(URLS)


def test_affinity_is_sticky_for_a_key() -> None:
    """The same prefix key always goes to the same replica while loads are even."""
    strategy = PrefixAffinity("tiergate-fast")
    pool = nodes()
    for key in keys(50):
        first = strategy.choose(pool, key, 0).replica
        assert all(strategy.choose(pool, key, tick).replica is first for tick in range(1, 5))


def test_affinity_uses_the_deepest_block() -> None:
    """Keys that share leading blocks but differ in the last one may go elsewhere."""
    strategy = PrefixAffinity("m")
    pool = nodes()
    targets = {strategy.choose(pool, (7, k), 0).replica.url for k in range(40)}
    assert len(targets) > 1


def test_two_gateways_agree_without_talking() -> None:
    """Two strategy instances (two gateway processes) choose the same replica for a key,
    whatever order they list the replicas in."""
    one, two = PrefixAffinity("tiergate-fast"), PrefixAffinity("tiergate-fast")
    pool = nodes()
    shuffled = list(reversed(pool))
    for key in keys(200):
        assert one.choose(pool, key, 0).replica.url == two.choose(shuffled, key, 3).replica.url


def test_affinity_spreads_keys_evenly() -> None:
    """Many distinct prefixes spread over the replicas close to evenly."""
    strategy = PrefixAffinity("tiergate-fast")
    pool = nodes()
    counts = Counter(strategy.choose(pool, key, 0).replica.url for key in keys(4000))
    assert len(counts) == 4
    assert max(counts.values()) < 1.15 * 1000
    assert min(counts.values()) > 0.85 * 1000


def test_model_seed_changes_the_mapping() -> None:
    """Each tier (served model) has its own mapping of prefixes to replicas."""
    pool = nodes()
    fast, precise = PrefixAffinity("tiergate-fast"), PrefixAffinity("tiergate-precise")
    same = sum(
        fast.choose(pool, k, 0).replica is precise.choose(pool, k, 0).replica for k in keys(400)
    )
    assert same < 200


def test_losing_a_replica_moves_only_its_prefixes() -> None:
    """Rendezvous hashing: when a replica leaves, keys on the others stay where they were."""
    strategy = PrefixAffinity("m")
    pool = nodes()
    before = {key: strategy.choose(pool, key, 0).replica.url for key in keys(500)}
    remaining = pool[1:]
    for key, url in before.items():
        after = strategy.choose(remaining, key, 0).replica.url
        if url != URLS[0]:
            assert after == url


def test_overloaded_preferred_replica_falls_to_the_next_ranked() -> None:
    """Above the bounded load the request goes to the key's next-ranked replica."""
    strategy = PrefixAffinity("m", load_factor=1.25, load_slack=2.0)
    pool = nodes()
    key = keys(1)[0]
    ranking = strategy.ranking(pool, key[-1])
    ranking[0].in_flight = 6  # mean 1.5: bound 1.25 * 7 / 4 + 2 = 4.19
    assert strategy.choose(pool, key, 0).replica is ranking[1]
    assert PrefixAffinity("m").choose(list(reversed(pool)), key, 0).replica is ranking[1]


def test_light_load_does_not_spread_a_hot_prefix() -> None:
    """The slack keeps a few concurrent requests of one prefix on its replica."""
    strategy = PrefixAffinity("m", load_factor=1.25, load_slack=4.0)
    pool = nodes()
    key = keys(1)[0]
    preferred = strategy.ranking(pool, key[-1])[0]
    preferred.in_flight = 3  # bound 1.25 * 4 / 4 + 4 = 5.25
    choice = strategy.choose(pool, key, 0)
    assert choice.replica is preferred
    assert choice.affinity is True


def test_imbalance_guard_picks_least_loaded() -> None:
    """When loads diverge a lot (SGLang's guard) the least-loaded replica wins."""
    strategy = PrefixAffinity("m", imbalance_abs=16, imbalance_rel=1.5)
    pool = nodes()
    for node in pool:
        node.waiting = 30
    idle = pool[2]
    idle.waiting = 0
    key = keys(1)[0]
    choice = strategy.choose(pool, key, 0)
    assert choice.replica is idle
    assert strategy.load_fallbacks == 1
    assert choice.affinity is False


def test_no_key_or_one_candidate_means_least_loaded() -> None:
    """Without a prefix key the strategy behaves like least-loaded."""
    strategy = PrefixAffinity("m")
    pool = nodes()
    pool[0].in_flight = pool[1].in_flight = pool[3].in_flight = 1
    choice = strategy.choose(pool, (), 0)
    assert choice.replica is pool[2]
    assert choice.affinity is None
    assert strategy.choose(pool[:1], (1, 2), 0).replica is pool[0]
