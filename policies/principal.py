"""Who is calling, and what their key allows. Built by authentication, read by later stages."""

from __future__ import annotations

from dataclasses import dataclass, field

# Scopes a key may carry beyond plain inference.
SCOPE_ROUTE_OVERRIDE = "route_override"  # may force a tier with the x-tiergate-tier header
SCOPE_DOWNGRADE = "downgrade"  # may fall back from the precise tier to the fast one
SCOPE_ENGINE_FIELDS = "engine_fields"  # may send engine control fields (priority, ...)
SCOPE_PRIORITY = "priority"  # may pick its queue class with the x-tiergate-priority header


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """Per-key limits. ``None`` means "no limit of this kind"."""

    allowed_tiers: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_tokens: int | None = None
    max_concurrency: int | None = None
    expires_at: float | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)
    # Compute budgets in cost units (policies/cost.py) per UTC day / calendar month.
    budget_daily: float | None = None
    budget_monthly: float | None = None
    # Completions one request may ask for: n, best_of, and n x prompts of a list prompt.
    max_n: int = 1
    # This key's overrides of the deployment's routing rules, "NAME:on" / "NAME:off" with NAME
    # one of policies.tiering.RULE_NAMES (json_schema, json_object, tools, long_prompt).
    rules: frozenset[str] = field(default_factory=frozenset)
    # The most of its recent requests this key may send to the precise tier (gateway/
    # precise_cap.py), and what happens over it: "downgrade" (to fast) or "refuse" (429).
    max_precise_share: float | None = None
    precise_share_over: str = "downgrade"
    # Its place when a tier is full (gateway/upstream/fair_queue.py): the priority class
    # ("interactive" before "batch") and its weight among the tenants waiting in that class.
    priority: str = "interactive"
    queue_weight: float = 1.0

    def allows_tier(self, tier: str) -> bool:
        """True when this key may use ``tier``."""
        return self.allowed_tiers is None or tier in self.allowed_tiers

    def has_scope(self, scope: str) -> bool:
        """True when the key carries ``scope``."""
        return scope in self.scopes


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a key id that is safe to log, never the key itself."""

    key_id: str
    tenant: str
    policy: KeyPolicy


# Used only when authentication is explicitly disabled for development.
DEVELOPMENT_PRINCIPAL = Principal(
    key_id="auth-disabled",
    tenant="development",
    # No limits in development, n and best_of included (still a bound: reservations multiply).
    policy=KeyPolicy(scopes=frozenset({SCOPE_ROUTE_OVERRIDE, SCOPE_DOWNGRADE}), max_n=128),
)
