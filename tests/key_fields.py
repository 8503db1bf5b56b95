"""KeyPolicy's fields as keyword arguments, for test helpers that build a key from them."""

from __future__ import annotations

from typing import TypedDict


class KeyPolicyFields(TypedDict, total=False):
    """What ``KeyPolicy(**fields)`` accepts (mypy flags a helper call that KeyPolicy would not)."""

    allowed_tiers: frozenset[str] | None
    rpm: int | None
    tpm: int | None
    max_tokens: int | None
    max_concurrency: int | None
    expires_at: float | None
    scopes: frozenset[str]
    budget_daily: float | None
    budget_monthly: float | None
    max_n: int
    max_precise_share: float | None
    precise_share_over: str
