"""Tier choice: explicit names, override scope, rules, classifier, allowed tiers, fallback."""

from __future__ import annotations

import functools
from typing import TypedDict, Unpack

import pytest

from policies.errors import InvalidRequest, ModelNotFound, PermissionDenied
from policies.principal import SCOPE_DOWNGRADE, SCOPE_ROUTE_OVERRIDE, KeyPolicy, Principal
from policies.requests import RequestSummary
from policies.tiering import TierCatalog, TierRules, decide_tier, fallback_tiers

CATALOG = TierCatalog({"fast": "m-int4", "precise": "m-fp16"}, fast="fast", precise="precise")
ANYONE = Principal("k1", "t", KeyPolicy())


class SummaryChanges(TypedDict, total=False):
    """Fields a test may set on the default summary."""

    response_format: str | None
    has_tools: bool
    prompt_chars: int


DEFAULT_SUMMARY = RequestSummary(
    kind="chat",
    model="auto",
    stream=False,
    max_tokens=None,
    include_usage=False,
    prompt_chars=100,
    has_tools=False,
    response_format=None,
)


def summary(model: str = "auto", **kw: Unpack[SummaryChanges]) -> RequestSummary:
    """A request summary with defaults."""
    return DEFAULT_SUMMARY._replace(model=model, **kw)


def decide(
    s: RequestSummary,
    principal: Principal = ANYONE,
    score: float = 0.2,
    override: str | None = None,
    rules: TierRules | None = None,
) -> tuple[str, str]:
    """Run decide_tier with a fixed score; return (tier, reason)."""
    d = decide_tier(
        s,
        catalog=CATALOG,
        principal=principal,
        rules=rules or TierRules(),
        score=lambda: score,
        threshold=0.5,
        override=override,
    )
    return d.tier, d.reason


def test_classifier_threshold() -> None:
    """Below the threshold goes fast, at or above goes precise."""
    assert decide(summary(), score=0.2) == ("fast", "classifier")
    assert decide(summary(), score=0.5) == ("precise", "classifier")


@pytest.mark.parametrize(("model", "tier"), [("fast", "fast"), ("m-fp16", "precise")])
def test_explicit_names_bypass_classifier(model: str, tier: str) -> None:
    """A tier or served model name forces the tier without scoring."""

    def boom() -> float:
        raise AssertionError("the classifier must not run")

    d = decide_tier(
        summary(model),
        catalog=CATALOG,
        principal=ANYONE,
        rules=TierRules(),
        score=boom,
        threshold=0.5,
    )
    assert (d.tier, d.reason) == (tier, "explicit")


def test_unknown_model() -> None:
    """Anything else is model_not_found."""
    with pytest.raises(ModelNotFound):
        decide(summary("gpt-4"))


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"response_format": "json_schema"}, "rule:json_schema"),
        ({"has_tools": True}, "rule:tools"),
        ({"prompt_chars": 100_000}, "rule:long_prompt"),
    ],
)
def test_hard_rules_send_precise(kw: SummaryChanges, reason: str) -> None:
    """Structured output, tools and very long prompts go to the precise tier."""
    assert decide(summary(**kw), score=0.0) == ("precise", reason)


def test_json_object_is_a_deployment_policy_not_a_hard_rule() -> None:
    """``json_object`` on a low-scored prompt goes fast by default, precise when the
    deployment turns ``json_object_to_precise`` on (issue 34: no escalation a key can buy)."""
    s = summary(response_format="json_object")
    assert decide(s, score=0.1) == ("fast", "classifier")
    on = TierRules(json_object_to_precise=True)
    assert decide(s, score=0.1, rules=on) == ("precise", "rule:json_object")


def test_override_needs_scope() -> None:
    """The override header works only for keys with the override scope."""
    scoped = Principal("k2", "t", KeyPolicy(scopes=frozenset({SCOPE_ROUTE_OVERRIDE})))
    assert decide(summary(), scoped, override="precise") == ("precise", "override")
    with pytest.raises(PermissionDenied):
        decide(summary(), ANYONE, override="precise")


def test_an_override_naming_no_tier_is_a_400_about_the_header() -> None:
    """``x-tiergate-tier: turbo`` is the header's fault: 400 naming the header, not a 404
    about the body's ``model`` (which was ``auto``); ``auto`` there means the fast tier."""
    scoped = Principal("k2", "t", KeyPolicy(scopes=frozenset({SCOPE_ROUTE_OVERRIDE})))
    with pytest.raises(InvalidRequest) as caught:
        decide(summary(), scoped, override="turbo")
    assert "x-tiergate-tier" in caught.value.message
    assert caught.value.param is None
    assert caught.value.code == "unknown_tier"
    assert decide(summary(), scoped, override="auto") == ("fast", "override")


def test_allowed_tiers_respected() -> None:
    """A fast-only key is refused an explicit precise and moved off an automatic one."""
    fast_only = Principal("k3", "t", KeyPolicy(allowed_tiers=frozenset({"fast"})))
    with pytest.raises(PermissionDenied):
        decide(summary("precise"), fast_only)
    assert decide(summary(), fast_only, score=0.9) == ("fast", "policy:allowed_tiers")


def test_fallback_order() -> None:
    """fast falls back to precise; precise to fast only with the downgrade scope."""
    down = Principal("k4", "t", KeyPolicy(scopes=frozenset({SCOPE_DOWNGRADE})))
    fallback = functools.partial(
        fallback_tiers, catalog=CATALOG, fast_to_precise=True, precise_to_fast=True
    )
    assert fallback("fast", principal=ANYONE) == ("fast", "precise")
    assert fallback("precise", principal=ANYONE) == ("precise",)
    assert fallback("precise", principal=down) == ("precise", "fast")


def test_a_key_turns_a_rule_on_or_off_for_itself() -> None:
    """Per-key overrides: json_object on for one key, tools and long prompts off for another;
    the deployment's rules stay for everyone else."""
    wants_json = Principal("k3", "t", KeyPolicy(rules=frozenset({"json_object:on"})))
    no_rules = Principal("k4", "t", KeyPolicy(rules=frozenset({"tools:off", "long_prompt:off"})))
    json_request = summary(response_format="json_object")
    assert decide(json_request, wants_json, score=0.1) == ("precise", "rule:json_object")
    assert decide(json_request, ANYONE, score=0.1) == ("fast", "classifier")
    assert decide(summary(has_tools=True), no_rules, score=0.1) == ("fast", "classifier")
    assert decide(summary(prompt_chars=100_000), no_rules, score=0.1) == ("fast", "classifier")
    assert decide(summary(has_tools=True), ANYONE, score=0.1) == ("precise", "rule:tools")
