"""Replica-selection strategies behind one interface (pure: no IO, no clocks)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar


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
    def running(self) -> float: ...

    @property
    def kv_usage(self) -> float: ...


R = TypeVar("R", bound=ReplicaLoad)


class Choice(NamedTuple, Generic[R]):
    """A strategy's pick for one request, and how it was made.

    ``affinity``: True when the prefix ranking decided, False when load overrode it, None
    when no prefix was followed (strategies without affinity always say None).
    """

    replica: R
    affinity: bool | None = None


class Strategy(Protocol):
    """Picks one of ``candidates`` (all up and below their cap) for a request."""

    name: str
    # Whether ``choose`` reads ``prefix_blocks``: when not, the caller need not hash them.
    uses_prefix: bool

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> Choice[R]:
        """Return the chosen replica; ``candidates`` is never empty."""
        ...


def load_of(replica: ReplicaLoad) -> float:
    """The load a strategy compares, in requests.

    The larger of what this gateway has in flight on the replica and what the replica last
    reported running plus waiting (which includes other gateways' requests).
    """
    return max(float(replica.in_flight), replica.running + replica.waiting)


class RoundRobin:
    """Each request to the next replica in turn."""

    name = "round_robin"
    uses_prefix = False

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> Choice[R]:
        """The candidate at ``tick`` modulo their number."""
        return Choice(candidates[tick % len(candidates)])


def least_loaded(candidates: Sequence[R], tick: int) -> R:
    """The least-loaded candidate; ties are broken by ``tick`` so that they spread."""
    n = len(candidates)
    start = tick % n
    best = candidates[start]
    best_load = load_of(best)
    for i in range(1, n):
        replica = candidates[(start + i) % n]
        load = load_of(replica)
        if load < best_load:
            best, best_load = replica, load
    return best


class LeastLoaded:
    """The replica with the least load."""

    name = "least_loaded"
    uses_prefix = False

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> Choice[R]:
        """The least-loaded candidate."""
        return Choice(least_loaded(candidates, tick))


_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """A 64-bit finaliser (splitmix64): spreads nearby inputs over the whole range."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


class PrefixAffinity:
    """Rendezvous hashing of the prefix key with a bounded-load rule and an imbalance guard.

    Every gateway process ranks the replicas of a tier for a prefix the same way (highest
    random weight of the key and the replica's URL, seeded with the tier's model), so that
    scaling the gateway out does not split a prefix over replicas. The request goes to the
    best-ranked replica whose in-flight count stays within ``load_factor`` times the mean
    (plus ``load_slack`` requests, so that light traffic is not spread for nothing); when
    none does, or when the cluster is clearly imbalanced (max - min load above
    ``imbalance_abs`` and max above ``imbalance_rel`` times min, SGLang's guard), the
    least-loaded replica wins. A replica that is down or at its cap is not a candidate, so
    its prefixes fall to their next-ranked replica, which every gateway agrees on too.

    The bound uses this gateway's own in-flight counts, which are exact and fresh; gateways
    that route alike see proportionally alike counts, so they spill alike. The imbalance
    guard and the least-loaded fallback use :func:`load_of`, which also sees what the
    replicas report (other gateways' traffic, their queues), a little stale.
    """

    name = "prefix_affinity"
    uses_prefix = True

    def __init__(
        self,
        seed: str = "",
        *,
        load_factor: float = 1.25,
        load_slack: float = 4.0,
        imbalance_abs: float = 16.0,
        imbalance_rel: float = 1.5,
    ) -> None:
        self.seed = seed
        self.load_factor = load_factor
        self.load_slack = load_slack
        self.imbalance_abs = imbalance_abs
        self.imbalance_rel = imbalance_rel
        self._ids: dict[str, int] = {}
        self.affinity_hits = 0
        self.load_fallbacks = 0

    def _replica_id(self, url: str) -> int:
        rid = self._ids.get(url)
        if rid is None:
            digest = hashlib.blake2b(f"{self.seed}\x1f{url}".encode(), digest_size=8).digest()
            rid = self._ids[url] = int.from_bytes(digest, "big")
        return rid

    def ranking(self, candidates: Sequence[R], key: int) -> list[R]:
        """``candidates`` from most to least preferred for ``key``."""
        return sorted(candidates, key=lambda r: _mix(key ^ self._replica_id(r.url)), reverse=True)

    def imbalanced(self, loads: Sequence[float]) -> bool:
        """SGLang's guard: the spread is large in absolute and in relative terms."""
        low, high = min(loads), max(loads)
        return high - low > self.imbalance_abs and high > self.imbalance_rel * low

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> Choice[R]:
        """The best-ranked candidate within the load bound, else the least-loaded one.

        The choice's ``affinity`` says whether it followed the prefix ranking (True), fell
        back to load (False), or had no prefix to follow (None).
        """
        if not prefix_blocks or len(candidates) == 1:
            return Choice(least_loaded(candidates, tick))
        loads = [load_of(r) for r in candidates]
        if self.imbalanced(loads):
            self.load_fallbacks += 1
            return Choice(least_loaded(candidates, tick), affinity=False)
        total = sum(r.in_flight for r in candidates)
        bound = self.load_factor * (total + 1) / len(candidates) + self.load_slack
        for replica in self.ranking(candidates, prefix_blocks[-1]):
            if replica.in_flight + 1 <= bound:
                self.affinity_hits += 1
                return Choice(replica, affinity=True)
        self.load_fallbacks += 1
        return Choice(least_loaded(candidates, tick), affinity=False)
