"""Default stages used when a feature is switched off: open auth (development) and no limits."""

from __future__ import annotations

from collections.abc import Mapping

from policies.principal import DEVELOPMENT_PRINCIPAL, Principal


class OpenAuthenticator:
    """Authentication explicitly disabled: every caller is the development principal."""

    async def authenticate(self, authorization: str | None) -> Principal:
        """Always the development principal."""
        return DEVELOPMENT_PRINCIPAL


class _Unlimited:
    headers: Mapping[str, str] = {}
    settles = False

    async def settle(self, used_tokens: int | None) -> None:
        """Nothing to reconcile."""

    async def withdraw(self) -> None:
        """Nothing was taken."""


_UNLIMITED = _Unlimited()


class NoLimits:
    """Rate limiting switched off."""

    async def admit(self, principal: Principal, reserve_tokens: int) -> _Unlimited:
        """Always admits."""
        return _UNLIMITED
