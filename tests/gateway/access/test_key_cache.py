"""The authenticator's key cache: freshness, unknown ids, forgetting and revalidation."""

from __future__ import annotations

from gateway.access.key_cache import DEGRADED_TTL_S, KeyCache
from policies.keys import issue_key
from policies.principal import KeyPolicy


def test_unknown_ids_are_remembered_only_while_a_feed_is_live() -> None:
    """Without a live feed an unknown id is asked again each time (a new key works at once)."""
    cache = KeyCache(ttl_s=30.0, unknown_ttl_s=10.0)
    for live in (None, False):
        cache.feed_live = live
        cache.put_unknown("abc", now=0.0)
        assert not cache.known_unknown("abc", now=0.1)
    cache.feed_live = True
    cache.put_unknown("abc", now=0.0)
    assert cache.known_unknown("abc", now=9.9)
    assert not cache.known_unknown("abc", now=10.1)


def test_unknown_ids_are_bounded_oldest_first() -> None:
    """A flood of distinct unknown ids keeps at most max_unknown entries, dropping the oldest."""
    cache = KeyCache(ttl_s=30.0, unknown_ttl_s=10.0, max_unknown=3)
    cache.feed_live = True
    for number in range(100):
        cache.put_unknown(f"id{number}", now=float(number) / 100)
    assert len(cache) == 3
    assert cache.known_unknown("id99", now=1.0)
    assert not cache.known_unknown("id0", now=1.0)


def test_forget_and_revalidate() -> None:
    """forget drops one id; revalidate makes every record stale but keeps it for outages."""
    cache = KeyCache(ttl_s=30.0, unknown_ttl_s=10.0)
    cache.feed_live = True
    one, two = issue_key("a", KeyPolicy(), now=0.0)[0], issue_key("b", KeyPolicy(), now=0.0)[0]
    cache.put(one, now=0.0)
    cache.put(two, now=0.0)
    cache.put_unknown("nobody", now=0.0)
    cache.forget(one.key_id)
    assert cache.entry(one.key_id) is None
    cache.revalidate()
    stale = cache.entry(two.key_id)
    assert stale is not None
    assert not cache.fresh(stale, now=0.0)
    assert not cache.known_unknown("nobody", now=0.0)


def test_a_down_feed_caps_record_freshness_at_a_second() -> None:
    """With the feed attached but down, a record is fresh for DEGRADED_TTL_S, not ttl_s."""
    cache = KeyCache(ttl_s=30.0, unknown_ttl_s=10.0)
    entry = cache.put(issue_key("a", KeyPolicy(), now=0.0)[0], now=0.0)
    cache.feed_live = True
    assert cache.fresh(entry, now=29.0)
    cache.feed_live = False
    assert cache.fresh(entry, now=DEGRADED_TTL_S - 0.01)
    assert not cache.fresh(entry, now=DEGRADED_TTL_S + 0.01)


def test_an_answer_read_across_a_change_is_not_remembered() -> None:
    """put / put_unknown with a generation older than the last change remember nothing."""
    cache = KeyCache(ttl_s=30.0, unknown_ttl_s=10.0)
    cache.feed_live = True
    record = issue_key("a", KeyPolicy(), now=0.0)[0]
    before = cache.generation
    cache.forget("someone-else")
    entry = cache.put(record, now=0.0, generation=before)
    assert entry.record is record
    assert cache.entry(record.key_id) is None
    cache.put_unknown("nobody", now=0.0, generation=before)
    assert not cache.known_unknown("nobody", now=0.0)
    current = cache.generation
    cache.put(record, now=0.0, generation=current)
    assert cache.entry(record.key_id) is not None
