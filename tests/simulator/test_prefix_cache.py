"""The prefix cache: block hashing, hits, LRU eviction, and what the replica reports."""

from __future__ import annotations

import aiohttp

from simulator.prefix_cache import PrefixCache, chain_hashes, chain_seed
from tests.simulator.procs import SimulatorProcess

SEED = chain_seed("m", None)


def _tokens(count: int, tag: str = "t") -> list[str]:
    return [f"{tag}{i}" for i in range(count)]


def test_chain_hashes_depend_on_the_whole_prefix() -> None:
    """A block's hash changes when any earlier token changes, and only full blocks hash."""
    base = chain_hashes(SEED, _tokens(40), 16)
    changed = _tokens(40)
    changed[3] = "other"
    assert len(base) == 2
    assert base[0] != chain_hashes(SEED, changed, 16)[0]
    assert base[1] != chain_hashes(SEED, changed, 16)[1]
    assert chain_hashes(chain_seed("m", "salt"), _tokens(40), 16) != base


def test_released_blocks_are_hit_by_the_next_request() -> None:
    """After commit and release, the same prefix is found again and held blocks count as used."""
    cache = PrefixCache(8, 16)
    hashes = chain_hashes(SEED, _tokens(48), 16)
    first = cache.acquire(hashes, 3)
    assert first is not None
    assert first.hit_blocks == 0
    cache.commit(first, hashes)
    assert cache.usage() == 3 / 8
    cache.release(first)
    assert cache.usage() == 0.0
    second = cache.acquire(hashes[:2], 3)
    assert second is not None
    assert second.hit_blocks == 2
    assert cache.usage() == 3 / 8


def test_lru_evicts_unused_blocks_but_never_held_ones() -> None:
    """Allocation evicts the least recently freed blocks and fails rather than evict held ones."""
    cache = PrefixCache(4, 16)
    old = chain_hashes(SEED, _tokens(32, "old"), 16)
    lease = cache.acquire(old, 2)
    assert lease is not None
    cache.commit(lease, old)
    cache.release(lease)
    holder = cache.acquire([], 3)
    assert holder is not None
    assert cache.cached_blocks() == 1
    assert cache.acquire(old, 2) is None
    again = cache.acquire(old, 1)
    assert again is not None
    assert again.hit_blocks == 1
    assert cache.usage() == 1.0
    assert cache.acquire([], 1) is None


def test_release_frees_tail_blocks_first() -> None:
    """When a freed prompt is partly evicted, its first (shared) blocks survive longest."""
    cache = PrefixCache(3, 16)
    hashes = chain_hashes(SEED, _tokens(48), 16)
    lease = cache.acquire(hashes, 3)
    assert lease is not None
    cache.commit(lease, hashes)
    cache.release(lease)
    filler = cache.acquire([], 1)
    assert filler is not None
    probe = cache.acquire(hashes, 2)
    assert probe is not None
    assert probe.hit_blocks == 2


def test_decode_blocks_are_cached_on_release() -> None:
    """Extra hashes given at release (computed reply blocks) become reusable prefix blocks."""
    cache = PrefixCache(8, 16)
    prompt = chain_hashes(SEED, _tokens(16), 16)
    full = chain_hashes(SEED, _tokens(40), 16)
    lease = cache.acquire(prompt[:0], 3)
    assert lease is not None
    cache.commit(lease, prompt)
    cache.release(lease, chain_hashes(prompt[-1], _tokens(40), 16, start=1))
    follow_up = cache.acquire(full, 3)
    assert follow_up is not None
    assert follow_up.hit_blocks == 2


async def _chat(
    session: aiohttp.ClientSession, sim: SimulatorProcess, question: str, salt: str | None = None
) -> dict[str, int]:
    system = "You are a careful assistant. " * 40
    body: dict[str, object] = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }
    if salt is not None:
        body["cache_salt"] = salt
    async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
        payload = await response.json()
    usage = payload["usage"]
    details = usage["prompt_tokens_details"] or {}  # null when nothing was cached, as vLLM
    return {"prompt": usage["prompt_tokens"], "cached": details.get("cached_tokens", 0)}


async def test_repeated_prefix_hits_the_cache(sim: SimulatorProcess) -> None:
    """A second request sharing a long system prompt reports cached tokens and counter hits."""
    async with aiohttp.ClientSession() as session:
        first = await _chat(session, sim, "What is one plus one?")
        second = await _chat(session, sim, "And two plus two?")
    assert first["cached"] == 0
    assert second["cached"] > 200
    assert second["cached"] % 16 == 0
    stats = await sim.astats()
    assert stats["prefix_cache_queries"] == first["prompt"] + second["prompt"]
    assert stats["prefix_cache_hits"] == second["cached"]
    metrics = sim.metrics_text()
    assert (
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiergate-fast"}} '
        f"{float(second['cached'])}" in metrics
    )


async def test_cache_salt_isolates_prefixes(sim: SimulatorProcess) -> None:
    """The same prompt with a different cache_salt does not hit; the same salt does."""
    async with aiohttp.ClientSession() as session:
        await _chat(session, sim, "Salted question?", salt="tenant-a")
        other = await _chat(session, sim, "Salted question?", salt="tenant-b")
        same = await _chat(session, sim, "Salted question?", salt="tenant-a")
        unsalted = await _chat(session, sim, "Salted question?")
    assert other["cached"] == 0
    assert unsalted["cached"] == 0
    assert same["cached"] > 200


async def test_multi_turn_reuses_prompt_and_reply_blocks(sim: SimulatorProcess) -> None:
    """Turn 2 of a chat hits the blocks of turn 1's prompt and of its generated reply."""
    turn1 = [
        {"role": "system", "content": "Be helpful. " * 30},
        {"role": "user", "content": "Tell me about caches."},
    ]
    async with aiohttp.ClientSession() as session:
        async with session.post(
            sim.url + "/v1/chat/completions",
            json={"messages": turn1, "max_tokens": 40, "ignore_eos": True},
        ) as response:
            first = await response.json()
        reply = first["choices"][0]["message"]["content"]
        turn2 = [
            *turn1,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "More, please."},
        ]
        async with session.post(
            sim.url + "/v1/chat/completions", json={"messages": turn2, "max_tokens": 4}
        ) as response:
            second = await response.json()
    computed = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == computed // 16 * 16
