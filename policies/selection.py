"""Replica-selection strategies behind one interface (pure: no IO, no clocks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class ReplicaLoad(Protocol):
    """What a strategy may read about a replica."""

    @property
    def url(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def max_concurrency(self) -> int: ...

    @property
    def waiting(self) -> float: ...

    @property
    def kv_usage(self) -> float: ...


R = TypeVar("R", bound=ReplicaLoad)


class Strategy(Protocol):
    """Picks one of ``candidates`` (all up and below their cap) for a request."""

    name: str

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> R:
        """Return the chosen replica; ``candidates`` is never empty."""
        ...


def load_of(replica: ReplicaLoad) -> float:
    """The load a strategy compares: the gateway's own in-flight plus the replica's queue."""
    return replica.in_flight + replica.waiting


class RoundRobin:
    """Each request to the next replica in turn."""

    name = "round_robin"

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> R:
        """The candidate at ``tick`` modulo their number."""
        return candidates[tick % len(candidates)]


class LeastLoaded:
    """The replica with the least load; ties broken by ``tick`` so they spread."""

    name = "least_loaded"

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> R:
        """The least-loaded candidate."""
        n = len(candidates)
        start = tick % n
        best = candidates[start]
        for i in range(1, n):
            replica = candidates[(start + i) % n]
            if load_of(replica) < load_of(best):
                best = replica
        return best
