"""A vLLM-like prefix cache: chained block hashes and an LRU of free cached blocks.

The cache owns ``num_blocks`` KV blocks of ``block_size`` tokens. A block is either free,
held without a hash by a running request (partial or not yet computed), or *cached*: it has
a hash and a reference count. Cached blocks with no reference sit in an LRU and are reused
(evicted) only when free blocks run out; blocks held by running requests are never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def chain_hashes(parent: int, tokens: Sequence[str], block_size: int, start: int = 0) -> list[int]:
    """Hashes of the full blocks of ``tokens`` from block ``start``, each chained to the last."""
    hashes: list[int] = []
    for begin in range(start * block_size, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[begin : begin + block_size])))
        hashes.append(parent)
    return hashes


def chain_seed(model: str, cache_salt: str | None) -> int:
    """The root of a hash chain: requests share blocks only with the same model and salt."""
    return hash(("tiergate-sim", model, cache_salt))


@dataclass(slots=True)
class Lease:
    """The blocks one request holds: hashed (shared) ones and anonymous private ones."""

    hit_blocks: int
    anonymous: int
    hashed: list[int] = field(default_factory=list)


class PrefixCache:
    """Block accounting, prefix lookup and LRU eviction."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._anonymous = 0

    def blocks_for(self, num_tokens: int) -> int:
        """How many blocks hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def usage(self) -> float:
        """Fraction of blocks held by running requests (what vLLM reports as KV usage)."""
        held = len(self._refs) - len(self._lru) + self._anonymous
        return held / self.num_blocks

    def cached_blocks(self) -> int:
        """How many blocks currently carry a hash (held or reusable)."""
        return len(self._refs)

    def acquire(self, lookup: Sequence[int], total_blocks: int) -> Lease | None:
        """Reuse the longest cached prefix of ``lookup`` and allocate the rest, or None if full."""
        refs = self._refs
        hit = 0
        idle_hits = 0
        for block_hash in lookup:
            count = refs.get(block_hash)
            if count is None:
                break
            hit += 1
            idle_hits += count == 0
        need = total_blocks - hit
        free = self.num_blocks - len(refs) - self._anonymous
        if free + len(self._lru) - idle_hits < need:
            return None
        hashed = list(lookup[:hit])
        for block_hash in hashed:
            count = refs[block_hash]
            if count == 0:
                del self._lru[block_hash]
            refs[block_hash] = count + 1
        while free < need:
            evicted, _ = self._lru.popitem(last=False)
            del refs[evicted]
            free += 1
        self._anonymous += need
        return Lease(hit, need, hashed)

    def commit(self, lease: Lease, block_hashes: Sequence[int]) -> None:
        """Publish the computed full blocks ``block_hashes`` (a chain) of a running request."""
        refs = self._refs
        for block_hash in block_hashes[len(lease.hashed) :]:
            if lease.anonymous == 0:
                break
            count = refs.get(block_hash)
            if count == 0:
                del self._lru[block_hash]
            refs[block_hash] = (count or 0) + 1
            lease.anonymous -= 1
            self._anonymous -= 1
            lease.hashed.append(block_hash)

    def release(self, lease: Lease, extra_hashes: Sequence[int] = ()) -> None:
        """Return a request's blocks; ``extra_hashes`` are its computed blocks past the prompt.

        Freed hashed blocks join the LRU tail-first, so a prompt's last blocks are evicted
        before its first ones (the shared system prompt lives longest).
        """
        refs = self._refs
        lru = self._lru
        for block_hash in extra_hashes:
            if lease.anonymous == 0:
                break
            if block_hash not in refs:
                refs[block_hash] = 0
                lru[block_hash] = None
                lease.anonymous -= 1
                self._anonymous -= 1
        for block_hash in reversed(lease.hashed):
            count = refs[block_hash] - 1
            refs[block_hash] = count
            if count == 0:
                lru[block_hash] = None
        lease.hashed.clear()
        self._anonymous -= lease.anonymous
        lease.anonymous = 0

    def drop_unused(self) -> None:
        """Forget every cached block no request holds (like vLLM's prefix-cache reset)."""
        for block_hash in self._lru:
            del self._refs[block_hash]
        self._lru.clear()
