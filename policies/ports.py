"""Ports: the interfaces the request path depends on. Adapters live in ``gateway``.

Each port has a real adapter and an in-memory one, and both pass one contract suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from policies.principal import Principal


class TierClassifier(Protocol):
    """Scores a request body: the probability that it needs the precise tier."""

    def score(self, body: Mapping[str, Any]) -> float:
        """A probability in [0, 1]."""
        ...


class Authenticator(Protocol):
    """Turns an ``Authorization`` header into a principal, or raises AuthenticationFailed."""

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind the header."""
        ...


class Admission(Protocol):
    """A request let through the limits; it must be settled exactly once."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The ``x-ratelimit-*`` headers to send."""
        ...

    @property
    def settles(self) -> bool:
        """False when nothing was reserved: ``settle`` and ``withdraw`` do nothing, and a
        caller may skip them."""
        ...

    @property
    def settle_first(self) -> bool:
        """True when the request must be settled before its answer's last byte is written
        (it holds a concurrency slot, or a budget whose remaining-budget header must show the
        settled spend); otherwise ``settle`` may run after the answer."""
        ...

    async def settle(self, used_tokens: int | None) -> None:
        """Reconcile reserved tokens with the real usage (``None``: unknown) and release."""
        ...

    async def withdraw(self) -> None:
        """The request was refused before it was forwarded: give back all it took.

        Its request, its reserved tokens and its concurrency slot; an alternative to
        ``settle`` (whichever comes first counts).
        """
        ...


class RequestLimiter(Protocol):
    """Applies a key's request, token and concurrency limits; raises RateLimited."""

    async def admit(self, principal: Principal, reserve_tokens: int) -> Admission:
        """Reserve one request and ``reserve_tokens`` tokens for ``principal``."""
        ...

    def admits_at_once(self, principal: Principal) -> bool:
        """Whether ``admit`` for this principal completes without waiting on any IO."""
        ...
