"""Choosing a tier for a request: explicit names, rules, the classifier, and key policy.

The order is fixed and documented in the README:

1. an explicit tier name or served model name in ``model`` forces that tier (``explicit``);
2. the ``x-tiergate-tier`` override header, only for keys with the override scope (``override``);
3. hard rules: a JSON schema (in ``response_format``, TGI's and llama.cpp's spellings of it
   included, or an engine's own field:
   ``structured_outputs.json``, ``guided_json``, ``json_schema``) / tools the model may call /
   very long prompts go to the precise tier (``rule:json_schema``, ``rule:tools``,
   ``rule:long_prompt``); ``json_object`` only
   when the deployment says so (``rule:json_object``, off by default);
4. the classifier's score against the threshold (``classifier``).

A key's allowed tiers are always respected: an explicit or override choice of a forbidden tier
is refused (403); an automatic choice of a forbidden tier moves to an allowed one
(``policy:allowed_tiers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from policies.errors import InvalidRequest, ModelNotFound, PermissionDenied
from policies.principal import SCOPE_DOWNGRADE, SCOPE_ROUTE_OVERRIDE, Principal
from policies.requests import RequestSummary

AUTO_MODEL = "auto"


@dataclass(frozen=True, slots=True)
class TierRules:
    """Configurable hard rules that send a request to the precise tier without scoring."""

    structured_output_to_precise: bool = True
    tools_to_precise: bool = True
    long_prompt_tokens: int | None = 6000
    json_object_to_precise: bool = False  # a key may turn any rule on or off: rules_for_key


RULE_NAMES = ("json_schema", "json_object", "tools", "long_prompt")
_RULE_FIELDS = {
    "json_schema": "structured_output_to_precise",
    "json_object": "json_object_to_precise",
    "tools": "tools_to_precise",
}
DEFAULT_LONG_PROMPT_TOKENS = 6000


def check_rule_overrides(overrides: frozenset[str]) -> None:
    """``ValueError`` unless every override is ``NAME:on`` or ``NAME:off`` of a known rule."""
    for item in overrides:
        name, _, state = item.partition(":")
        if name not in RULE_NAMES or state not in ("on", "off"):
            raise ValueError(
                f"a rule override is NAME:on or NAME:off with NAME one of {', '.join(RULE_NAMES)}"
                f" (got {item[:60]!r})"
            )


def rules_for_key(rules: TierRules, overrides: frozenset[str]) -> TierRules:
    """The deployment's ``rules`` with a key's ``NAME:on`` / ``NAME:off`` overrides applied."""
    if not overrides:
        return rules
    changes: dict[str, object] = {}
    for item in overrides:
        name, _, state = item.partition(":")
        on = state == "on"
        if name == "long_prompt":
            limit = rules.long_prompt_tokens or DEFAULT_LONG_PROMPT_TOKENS
            changes["long_prompt_tokens"] = limit if on else None
        elif name in _RULE_FIELDS:
            changes[_RULE_FIELDS[name]] = on
    return replace(rules, **changes)  # type: ignore[arg-type]


class RouteDecision(NamedTuple):
    """The tier chosen for a request and why; ``score`` is set when the classifier ran."""

    tier: str
    reason: str
    score: float | None = None


class TierCatalog:
    """Resolves the ``model`` field: ``auto``, a tier name, or a tier's served model name."""

    def __init__(self, served_models: Mapping[str, str], fast: str, precise: str) -> None:
        if fast not in served_models or precise not in served_models:
            raise ValueError("the fast and precise tiers must both be configured")
        self.tiers: tuple[str, ...] = tuple(served_models)
        self.served_models = dict(served_models)
        self.fast = fast
        self.precise = precise
        self._by_name: dict[str, str] = {}
        for tier, served in served_models.items():
            self._by_name[served] = tier
        for tier in served_models:
            self._by_name[tier] = tier

    def explicit_tier(self, model: str) -> str | None:
        """The tier ``model`` forces, ``None`` for ``auto``; raises 404 for anything else."""
        if model == AUTO_MODEL:
            return None
        tier = self._by_name.get(model)
        if tier is None:
            raise ModelNotFound(
                f"The model '{model[:100]}' does not exist. Use 'auto', a tier name "
                f"({', '.join(self.tiers)}) or a served model name.",
                param="model",
            )
        return tier

    def override_tier(self, name: str) -> str:
        """The tier an ``x-tiergate-tier`` header names (``auto``: the fast tier); 400 for a
        name that is no tier: the header is at fault, not the body's ``model``."""
        try:
            return self.explicit_tier(name) or self.fast
        except ModelNotFound:
            raise InvalidRequest(
                f"The x-tiergate-tier header names no tier: '{name[:100]}'. Use a tier name "
                f"({', '.join(self.tiers)}) or a served model name.",
                code="unknown_tier",
            ) from None


def _rule_reason(summary: RequestSummary, rules: TierRules) -> str | None:
    if rules.structured_output_to_precise and summary.response_format == "json_schema":
        return "rule:json_schema"
    if rules.json_object_to_precise and summary.response_format == "json_object":
        return "rule:json_object"
    if rules.tools_to_precise and summary.has_tools:
        return "rule:tools"
    limit = rules.long_prompt_tokens
    if limit is not None and summary.prompt_token_estimate > limit:
        return "rule:long_prompt"
    return None


def _forced(tier: str, reason: str, principal: Principal) -> RouteDecision:
    if not principal.policy.allows_tier(tier):
        raise PermissionDenied(
            f"This key may not use the '{tier}' tier.", param="model", code="tier_not_allowed"
        )
    return RouteDecision(tier=tier, reason=reason)


def _respect_allowed(
    decision: RouteDecision, catalog: TierCatalog, principal: Principal
) -> RouteDecision:
    if principal.policy.allows_tier(decision.tier):
        return decision
    for tier in (catalog.fast, catalog.precise, *catalog.tiers):
        if principal.policy.allows_tier(tier):
            return RouteDecision(tier=tier, reason="policy:allowed_tiers", score=decision.score)
    raise PermissionDenied("This key may not use any tier.", code="tier_not_allowed")


def decide_tier(
    summary: RequestSummary,
    *,
    catalog: TierCatalog,
    principal: Principal,
    rules: TierRules,
    score: Callable[[], float],
    threshold: float,
    override: str | None = None,
) -> RouteDecision:
    """Pick the tier for a validated request; ``score`` is called only when needed."""
    explicit = catalog.explicit_tier(summary.model)
    if explicit is not None:
        return _forced(explicit, "explicit", principal)
    if override:
        if not principal.policy.has_scope(SCOPE_ROUTE_OVERRIDE):
            raise PermissionDenied(
                "This key may not use the x-tiergate-tier override.", code="override_not_allowed"
            )
        return _forced(catalog.override_tier(override), "override", principal)
    rule = _rule_reason(summary, rules_for_key(rules, principal.policy.rules))
    if rule is not None:
        decision = RouteDecision(tier=catalog.precise, reason=rule)
    else:
        value = score()
        tier = catalog.precise if value >= threshold else catalog.fast
        decision = RouteDecision(tier=tier, reason="classifier", score=value)
    return _respect_allowed(decision, catalog, principal)


def fallback_tiers(
    tier: str,
    *,
    catalog: TierCatalog,
    principal: Principal,
    fast_to_precise: bool,
    precise_to_fast: bool,
) -> tuple[str, ...]:
    """The tiers to try, in order, when ``tier`` has no healthy capacity.

    fast → precise is on by default (more expensive, never worse); precise → fast needs both
    the setting and a key with the downgrade scope, because it may lower answer quality.
    """
    order = [tier]
    if tier == catalog.fast and fast_to_precise:
        order.append(catalog.precise)
    elif (
        tier == catalog.precise and precise_to_fast and principal.policy.has_scope(SCOPE_DOWNGRADE)
    ):
        order.append(catalog.fast)
    return tuple(t for t in order if principal.policy.allows_tier(t))
