"""Speed-aware choices: a clearly slower replica loses ties and holds less, equal ones do not."""

from __future__ import annotations

from policies.selection import LeastLoaded, PrefixAffinity, slowness
from tests.policies.test_selection import Node, keys, nodes

MARGIN = 1.5


def two(fast_s: float = 0.01, slow_s: float = 0.03) -> list[Node]:
    """An idle fast and an idle slow replica (seconds per completion token)."""
    return [Node("http://fast:1", token_s=fast_s), Node("http://slow:1", token_s=slow_s)]


def test_slowness_is_none_within_the_margin_or_when_off() -> None:
    """Speeds within the margin, a single known speed, or the feature off: no factors."""
    assert slowness(two(0.01, 0.014), MARGIN) is None
    assert slowness(two(0.01, 0.0), MARGIN) is None  # one speed alone is the mean
    assert slowness(two(), None) is None
    assert slowness(two(), MARGIN) == [1.0, 3.0]


def test_a_replica_with_no_data_counts_as_the_mean() -> None:
    """No data: the mean of the known speeds, so it is neither avoided nor preferred blindly."""
    pool = [*two(), Node("http://new:1")]
    factors = slowness(pool, MARGIN)
    assert factors == [1.0, 3.0, 2.0]  # mean 0.02 over the fastest 0.01


def test_least_loaded_prefers_the_clearly_faster_idle_replica_on_every_tick() -> None:
    """Sequential traffic (both idle): every tie goes to the fast replica, not every other."""
    pool = two()
    strategy = LeastLoaded(speed_margin=MARGIN)
    assert {strategy.choose(pool, (), tick).replica.url for tick in range(10)} == {"http://fast:1"}
    today = LeastLoaded()
    assert len({today.choose(pool, (), tick).replica.url for tick in range(10)}) == 2


def test_least_loaded_weighs_load_by_slowness() -> None:
    """The 3x slower replica gets work once the fast one holds two requests (score 3 vs 3+)."""
    fast, slow = pool = two()
    strategy = LeastLoaded(speed_margin=MARGIN)
    fast.in_flight = 1
    assert strategy.choose(pool, (), 1).replica is fast  # 2 < 3
    fast.in_flight = 3
    assert strategy.choose(pool, (), 0).replica is slow  # 4 > 3


def test_equal_speeds_choose_exactly_as_without_speeds() -> None:
    """Within the margin every choice (ties, loads, affinity) is today's."""
    with_speed = PrefixAffinity("m", speed_margin=MARGIN)
    without = PrefixAffinity("m")
    pool = nodes()
    for i, node in enumerate(pool):
        node.token_s = 0.010 + 0.001 * i  # 1.3x spread at most
        node.in_flight = i % 3
    for tick, key in enumerate(keys(300)):
        assert with_speed.choose(pool, key, tick) == without.choose(pool, key, tick)
        assert with_speed.choose(pool, (), tick) == without.choose(pool, (), tick)


def test_a_slow_replica_keeps_its_speed_share_of_prefixes_and_only_its_move() -> None:
    """Weighted rendezvous: a 3x slower replica of two keeps about a quarter of the keys
    (1/3 : 1), every one of them a key it held at equal speeds; the affinity still decides."""
    fast_speed = PrefixAffinity("m", speed_margin=MARGIN)
    today = PrefixAffinity("m")
    pool = two()
    owners = {key: fast_speed.choose(pool, key, 0).replica.url for key in keys(400)}
    slow_keys = {key for key, url in owners.items() if url == "http://slow:1"}
    assert 70 <= len(slow_keys) <= 130  # 100 expected
    assert all(today.choose(pool, key, 0).replica.url == "http://slow:1" for key in slow_keys)
    assert fast_speed.load_fallbacks == 0
    assert fast_speed.affinity_hits == 400


def test_a_slow_replica_holds_fewer_requests_before_its_prefixes_spill() -> None:
    """Its bound is divided by its slowness: 3 in flight is past it, so the key goes to its
    next-ranked replica (the fast one), as for any replica past its bound."""
    strategy = PrefixAffinity("m", speed_margin=MARGIN)
    fast, slow = pool = two()
    key = next(k for k in keys(50) if strategy.ranking(pool, k[-1])[0] is slow)
    slow.in_flight, fast.in_flight = 3, 1  # bound 1.25 * 5 / 2 + 4 = 7.1; / 3 = 2.4
    choice = strategy.choose(pool, key, 0)
    assert choice.replica is fast
    assert PrefixAffinity("m").choose(pool, key, 0).replica is slow  # without speeds
