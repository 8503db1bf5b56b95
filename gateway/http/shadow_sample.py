"""A request sampled for shadow evaluation: whether an answered request is, and handing it over.

The pipeline (gateway/http/proxy.py) asks :func:`sampled_shadow` once a tier has answered;
the :class:`Shadow` it gets is submitted with the answer's text once that is known (after a
whole answer, or a stream relayed complete). The shadow itself runs in
gateway/routing/shadow.py, never awaited by the caller's response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.pipeline.context import RequestContext
from gateway.pipeline.request_body import FieldRules
from gateway.routing.shadow import ShadowRunner
from policies.requests import RequestSummary


@dataclass(frozen=True, slots=True)
class Shadow:
    """A request sampled for shadow evaluation, to hand over once its answer is known."""

    runner: ShadowRunner
    direction: str
    path: str
    body: dict[str, Any]
    score: float | None
    max_tokens: int
    summary: RequestSummary | None  # the shadow's worst case: prompt estimate, completions
    tenant: str  # the caller's tenant, for the record (never the key)

    def submit(self, answer: str) -> None:
        """Start the shadow (never awaited by the caller's response)."""
        known = self.summary
        self.runner.submit(
            self.direction, self.path, self.body, answer, self.score, max_tokens=self.max_tokens,
            prompt_tokens=known.prompt_token_estimate if known else 0,
            completions=known.completions if known else 1, tenant=self.tenant,
        )  # fmt: skip


def sampled_shadow(
    runner: ShadowRunner | None,
    ctx: RequestContext,
    path: str,
    body: dict[str, Any],
    *,
    fields: FieldRules,
    tier_caps: Mapping[str, int],
) -> Shadow | None:
    """Whether this answered request is sampled for shadow evaluation.

    Never for a tier this key may not use or whose rules would refuse the body, nor beyond
    the tenant's per-minute sample budget (``router.shadow.tenant_samples_per_minute``, kept
    in this process: no IO); the shadow's ``max_tokens`` is clamped to the target tier's (and
    the key's) cap.
    """
    principal = ctx.principal
    if runner is None or ctx.tier is None or principal is None:
        return None
    direction = runner.sample(ctx.tier)
    if direction is None:
        return None
    target = runner.target_of(direction)
    if not principal.policy.allows_tier(target) or not fields.accepts(body, target):
        return None
    if not runner.admit(direction, principal.tenant):
        return None
    cap = tier_caps[target]
    if principal.policy.max_tokens is not None:
        cap = min(cap, principal.policy.max_tokens)
    score = ctx.decision.score if ctx.decision is not None else None
    return Shadow(runner, direction, path, body, score, cap, ctx.summary, principal.tenant)
