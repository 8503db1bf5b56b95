"""Replica-selection strategies behind one interface (pure: no IO, no clocks)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
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

    @property
    def token_s(self) -> float:
        """Its recent seconds per completion token (a decaying average; 0: no data yet)."""
        ...


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


def slowness(candidates: Sequence[ReplicaLoad], margin: float | None) -> list[float] | None:
    """How much slower each candidate is than the fastest, where clearly so; else ``None``.

    A candidate's factor is its seconds per completion token over the fastest candidate's
    when that ratio is at least ``margin``, else 1 (a candidate with no data counts as the
    mean of those with data). ``None`` (the usual case, and always when ``margin`` is
    ``None``: the feature is off) when no candidate is ``margin`` times slower than the
    fastest, so that strategies behave exactly as without speeds.
    """
    if margin is None:
        return None
    known = [r.token_s for r in candidates if r.token_s > 0]
    if len(known) < 2:  # one speed alone is the mean: nobody is slower
        return None
    best = min(known)
    if max(known) < margin * best:
        return None
    mean = sum(known) / len(known)
    factors = [(r.token_s or mean) / best for r in candidates]
    return [f if f >= margin else 1.0 for f in factors]


def least_loaded(candidates: Sequence[R], tick: int, margin: float | None = None) -> R:
    """The least-loaded candidate; ties are broken by ``tick`` so that they spread.

    With ``margin``, a clearly slower candidate (:func:`slowness`) has its load plus one
    multiplied by its factor: an idle replica three times slower loses to the faster one
    until the faster one holds two requests.
    """
    n = len(candidates)
    factors = slowness(candidates, margin) or [1.0] * n
    start = tick % n
    best, best_score = candidates[start], (load_of(candidates[start]) + 1) * factors[start]
    for i in range(1, n):
        at = (start + i) % n
        score = (load_of(candidates[at]) + 1) * factors[at]
        if score < best_score:
            best, best_score = candidates[at], score
    return best


class LeastLoaded:
    """The replica with the least load (weighted by speed when ``speed_margin`` is set)."""

    name = "least_loaded"
    uses_prefix = False

    def __init__(self, *, speed_margin: float | None = None) -> None:
        self.speed_margin = speed_margin

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> Choice[R]:
        """The least-loaded candidate."""
        return Choice(least_loaded(candidates, tick, self.speed_margin))


_MASK = (1 << 64) - 1
_SPAN = float(1 << 64)


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

    With ``speed_margin``, a replica clearly slower than the fastest candidate
    (:func:`slowness`, factor ``f``) counts as ``1/f`` of a replica: its weight in the
    rendezvous hash is ``1/f`` (weighted rendezvous: it keeps that share of the prefixes it
    would hold at full speed, and only its prefixes move), its bound is divided by ``f``, and
    the fallbacks weigh load by speed. While no replica is ``speed_margin`` times slower,
    every choice is the one made without speeds.
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
        speed_margin: float | None = None,
    ) -> None:
        self.seed = seed
        self.load_factor = load_factor
        self.load_slack = load_slack
        self.imbalance_abs = imbalance_abs
        self.imbalance_rel = imbalance_rel
        self.speed_margin = speed_margin
        self._ids: dict[str, int] = {}
        self.affinity_hits = 0
        self.load_fallbacks = 0

    def _replica_id(self, url: str) -> int:
        rid = self._ids.get(url)
        if rid is None:
            digest = hashlib.blake2b(f"{self.seed}\x1f{url}".encode(), digest_size=8).digest()
            rid = self._ids[url] = int.from_bytes(digest, "big")
        return rid

    def ranking(
        self, candidates: Sequence[R], key: int, slow: Mapping[str, float] | None = None
    ) -> list[R]:
        """``candidates`` from most to least preferred for ``key``.

        ``slow``: the slowness factor of the clearly slower ones (by URL); each competes with
        weight ``1/f``, as in weighted rendezvous hashing (score ``w / -ln(u)``, ``u`` the
        hash in (0, 1)), so it wins about that share of the keys it would win at weight 1.
        """
        if not slow:
            return sorted(
                candidates, key=lambda r: _mix(key ^ self._replica_id(r.url)), reverse=True
            )

        def score(r: R) -> float:
            u = (_mix(key ^ self._replica_id(r.url)) + 0.5) / _SPAN
            return 1.0 / (-math.log(u) * slow.get(r.url, 1.0))

        return sorted(candidates, key=score, reverse=True)

    def imbalanced(self, loads: Sequence[float]) -> bool:
        """SGLang's guard: the spread is large in absolute and in relative terms."""
        low, high = min(loads), max(loads)
        return high - low > self.imbalance_abs and high > self.imbalance_rel * low

    def choose(self, candidates: Sequence[R], prefix_blocks: Sequence[int], tick: int) -> Choice[R]:
        """The best-ranked candidate within the load bound, else the least-loaded one.

        The choice's ``affinity`` says whether it followed the prefix ranking (True), fell
        back to load (False), or had no prefix to follow (None).
        """
        margin = self.speed_margin
        if not prefix_blocks or len(candidates) == 1:
            return Choice(least_loaded(candidates, tick, margin))
        loads = [load_of(r) for r in candidates]
        if self.imbalanced(loads):
            self.load_fallbacks += 1
            return Choice(least_loaded(candidates, tick, margin), affinity=False)
        total = sum(r.in_flight for r in candidates)
        bound = self.load_factor * (total + 1) / len(candidates) + self.load_slack
        factors = slowness(candidates, margin)
        slow: dict[str, float] = {}
        if factors is not None:
            slow = {r.url: f for r, f in zip(candidates, factors, strict=True) if f > 1}
        for replica in self.ranking(candidates, prefix_blocks[-1], slow):
            if replica.in_flight + 1 <= bound / slow.get(replica.url, 1.0):
                self.affinity_hits += 1
                return Choice(replica, affinity=True)
        self.load_fallbacks += 1
        return Choice(least_loaded(candidates, tick, margin), affinity=False)
