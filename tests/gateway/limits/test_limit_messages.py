"""The text of a rate-limit 429 when a process enforces only a share of a key's limits.

Two ways a process holds a share: the memory backend with
``ratelimit.memory_divide_per_worker`` (each of N workers keeps 1/N of every limit, for
good), and the local fallback while Redis is unreachable (``on_redis_error: open``: 1/N of the
live processes, until Redis answers). Either way the message must state the key's own limit,
which is what its owner configured and can look up, and say which share refused it.
"""

from __future__ import annotations

import pytest

from gateway.config.redis_client import open_redis
from gateway.config.settings import RateLimitSettings, RedisSettings
from gateway.limits.limits import KeyLimiter, LimitMetrics, build_limiter
from policies.errors import RateLimited
from policies.principal import KeyPolicy, Principal
from tests.processes import free_port


def _key(*, rpm: int | None = None, tpm: int | None = None) -> Principal:
    return Principal("kid", "tenant", KeyPolicy(rpm=rpm, tpm=tpm))


def _per_worker(workers: int) -> KeyLimiter:
    settings = RateLimitSettings(backend="memory", memory_divide_per_worker=True)
    return build_limiter(
        settings, key_prefix="", lease_s=60.0, workers=workers, client=None, metrics=LimitMetrics()
    )


async def _refusal(limiter: KeyLimiter, principal: Principal, tokens: int) -> RateLimited:
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(principal, tokens)
    return refused.value


async def test_too_large_for_a_workers_share_names_the_keys_tpm() -> None:
    """tpm 100 over 2 workers: 80 tokens never fit a worker's 50 (final, x-should-retry:
    false), and the message says the key allows 100, 50 of them per worker."""
    refused = await _refusal(_per_worker(2), _key(tpm=100), 80)
    assert (refused.headers or {}).get("x-should-retry") == "false"
    assert "allows 100 tokens per minute" in str(refused), str(refused)
    assert "50 in each of 2 worker processes" in str(refused), str(refused)


async def test_a_spent_workers_share_of_rpm_names_the_keys_rpm() -> None:
    """rpm 4 over 2 workers: the third request in a minute is refused by the worker's 2; the
    message states the key's 4 and the share."""
    limiter, principal = _per_worker(2), _key(rpm=4)
    for _ in range(2):
        await limiter.admit(principal, 1)
    refused = await _refusal(limiter, principal, 1)
    assert "limit 4" in str(refused), str(refused)
    assert "2 in each of 2 worker processes" in str(refused), str(refused)


async def test_a_workers_share_of_tpm_and_concurrency_names_the_keys_limits() -> None:
    """tpm 100 and 4 in flight over 2 workers: a worker's 50 tokens and 2 slots spent, the
    refusals name the key's 100 and 4."""
    limiter = _per_worker(2)
    tokens = _key(tpm=100)
    await limiter.admit(tokens, 40)
    by_tokens = await _refusal(limiter, tokens, 20)
    assert "limit 100" in str(by_tokens), str(by_tokens)
    assert "50 in each of 2 worker processes" in str(by_tokens), str(by_tokens)
    slots = Principal("kid2", "tenant", KeyPolicy(max_concurrency=4))
    held = [await limiter.admit(slots, 1) for _ in range(2)]
    by_slots = await _refusal(limiter, slots, 1)
    assert "limit 4 in flight" in str(by_slots), str(by_slots)
    assert "2 in each of 2 worker processes" in str(by_slots), str(by_slots)
    for admission in held:
        await admission.settle(1)


async def test_a_degraded_share_names_the_keys_tpm_and_the_outage() -> None:
    """Redis unreachable (a closed port), 2 processes: 80 tokens fit the key's 100 once Redis
    is back (retryable), and the message states the key's 100, not the process's 50."""
    settings = RateLimitSettings(backend="redis", degraded_replicas=2)
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = open_redis(RedisSettings(url=url, socket_timeout_s=0.5))
    limiter = build_limiter(
        settings, key_prefix="msg:", lease_s=60.0, workers=1, client=client, metrics=LimitMetrics()
    )
    try:
        refused = await _refusal(limiter, _key(tpm=100), 80)
    finally:
        await client.aclose()
    assert (refused.headers or {}).get("x-should-retry") != "false"
    assert "limit 100" in str(refused), str(refused)
    assert "limit 50" not in str(refused), str(refused)
    assert "unreachable" in str(refused), str(refused)
