"""The inference endpoints: authenticate, validate, limit, route, forward, relay.

This module orchestrates the stages; each stage is an object built once in ``create_app``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog

from gateway.http.settlement import (
    SETTLED,
    abandoned_usage,
    after_complete,
    ready,
    reserved_usage,
    withdraw,
)
from gateway.http.shadow_sample import Shadow, sampled_shadow
from gateway.http.stream_settle import settled_before_end
from gateway.http.upstream_body import prepare_upstream, tier_contexts
from gateway.limits.budgets import BudgetGate, with_budget
from gateway.limits.precise_cap import EscalationTracker, PreciseShareCap
from gateway.pipeline.context import (
    Failure,
    RequestContext,
    RequestObserver,
    request_id_from,
)
from gateway.pipeline.eager import Eager, eager
from gateway.pipeline.errors import ClientGone, Refused
from gateway.pipeline.events import AttemptEnd, AttemptStart, Outcome, Usage
from gateway.pipeline.replies import EVENT_STREAM, Inbound, Reply, error_reply, internal_error_reply
from gateway.pipeline.request_body import FieldRules, decode
from gateway.pipeline.usage_bound import UsageBound, UsageClipper
from gateway.routing.routing import TierRouter
from gateway.routing.shadow import ShadowRunner
from gateway.routing.spillover import Spillover
from gateway.upstream.attempt import Opened, whole_usage
from gateway.upstream.fair_queue import PRIORITY_HEADER, ticket_for
from gateway.upstream.forwarding import Exchange, Forwarded, Forwarder
from gateway.upstream.pump import Pump
from gateway.upstream.relay import StreamRelay
from policies.context_window import fitting_tiers
from policies.errors import (
    AuthenticationFailed,
    InvalidRequest,
    TierGateError,
    UnsupportedMediaType,
)
from policies.fields import MediaUrl
from policies.ports import Admission, Authenticator, RequestLimiter
from policies.prefix import PrefixConfig
from policies.principal import Principal
from policies.requests import (
    RequestKind,
    RequestSummary,
    check_completions,
    default_max_tokens,
    validate,
)
from policies.tiering import RouteDecision

_log = structlog.get_logger("tiergate.proxy")
_NO_HEADERS: Mapping[str, str] = {}


@dataclass(slots=True)
class ProxyService:
    """Everything the inference endpoints need, built once."""

    auth: Authenticator
    limiter: RequestLimiter
    router: TierRouter
    forwarder: Forwarder
    tier_caps: Mapping[str, int]
    idle_timeouts: Mapping[str, float]
    # Per tier: the max_tokens written into a request that sets none (at most the tier's cap).
    default_max_tokens: Mapping[str, int]
    observer: RequestObserver
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    spillover: Spillover | None = None
    fields: FieldRules = field(default_factory=lambda: FieldRules({}, {}))
    shadow: ShadowRunner | None = None
    budgets: BudgetGate | None = None
    # A backend's usage, clipped to what the request could have used before it settles.
    clip_usage: UsageClipper = field(default_factory=UsageClipper)
    precise_cap: PreciseShareCap | None = None
    escalation: EscalationTracker | None = None
    # Told of every refused credential (gateway.telemetry.refusals); only refusals call it.
    refused: Refused | None = None
    # requests.prefix_cache_scope: tenant (each tenant's cache_salt written) or shared.
    salt_per_tenant: bool = True

    async def handle(self, inbound: Inbound, kind: RequestKind, path: str) -> Reply:
        """Serve one chat or completion request; every error becomes its OpenAI-shaped reply."""
        headers = inbound.headers
        ctx = RequestContext(request_id_from(headers.get("x-request-id")), route=path)
        ctx.trace = self.observer.started(ctx, headers)
        try:
            return await self._serve(inbound, ctx, kind, path)
        except TierGateError as exc:
            ctx.status = exc.status
            ctx.failure = Failure.of(exc)
            self.observer.finished(ctx, ctx.failure.kind)
            if self.refused is not None and isinstance(exc, AuthenticationFailed):
                self.refused(path, exc.code, inbound.client_host)
            return error_reply(exc, ctx.headers())
        except Exception:  # noqa: BLE001  # a bug: account for the request and answer 500, never a traceback
            _log.exception("request.unhandled_error")
            ctx.status = 500
            self.observer.finished(ctx, Outcome.INTERNAL_ERROR)
            return internal_error_reply(ctx.headers())

    async def _serve(
        self, inbound: Inbound, ctx: RequestContext, kind: RequestKind, path: str
    ) -> Reply:
        headers = inbound.headers
        principal = await self.auth.authenticate(headers.get("authorization"))
        ctx.principal = principal
        ticket = ticket_for(principal, headers.get(PRIORITY_HEADER))
        ctx.mark("auth")
        _check_encoding(headers.get("content-encoding"))
        raw = await inbound.read_body()
        body_bytes = len(raw)  # bounds the prompt tokens a backend may report
        body = decode(raw, self.fields.max_depth)
        del raw  # not held while the request is forwarded
        summary = validate(body, kind)
        ctx.summary = summary
        check_completions(summary, principal.policy.max_n)
        ctx.mark("validate")
        admitted = await self._admit(ctx, body, summary, principal, headers, body_bytes=body_bytes)
        admission = admitted.admission
        attempts = _Attempts(ctx)
        try:
            forwarding = self.forwarder.forward(
                path, body, admitted.tiers, admitted.blocks, attempts, ticket=ticket
            )
            forwarded = await inbound.unless_gone(forwarding)
        except ClientGone:
            ctx.usage = abandoned_usage(summary, admitted.bound, attempts.tier)
            ctx.tier = attempts.tier
            await admission.settle(ctx.usage.total if ctx.usage is not None else 0)
            raise
        except BaseException:
            await admission.settle(0)
            raise
        _answered(ctx, forwarded)
        shadow = sampled_shadow(
            self.shadow, ctx, path, body, fields=self.fields, tier_caps=self.tier_caps
        )
        exchange = forwarded.exchange
        if exchange.opened.body is not None:
            return await self._complete(ctx, exchange.opened, admission, shadow, admitted.bound)
        return self._stream(
            ctx, exchange, admission, shadow, admitted.bound, strip_usage=admitted.strip_usage
        )

    async def _admit(
        self,
        ctx: RequestContext,
        body: dict[str, Any],
        summary: RequestSummary,
        principal: Principal,
        headers: Mapping[str, str],
        *,
        body_bytes: int,
    ) -> _Admitted:
        """Route and prepare the request while the limits admit it."""
        kind = summary.kind
        # Without max_tokens the backend would generate to the end of the context: the
        # gateway writes a bound into the body (before forwarding) and reserves that much.
        everywhere = self.default_max_tokens.values()
        key_cap = principal.policy.max_tokens
        completion = summary.max_tokens or default_max_tokens(everywhere, key_cap, kind)
        reserve = summary.prompt_token_estimate + completion * summary.completions
        # Always awaited below (or by withdraw): an admission dropped un-awaited would be
        # closed unfinished, its concurrency slot left to the lease.
        admitting = self._start_admission(principal, reserve)
        try:
            decision, tiers, media = self._classify(body, summary, principal, headers, completion)
            tiers = self._fit_context(ctx, body, summary, tiers)
            self._refuse_never_fitting(principal, tiers, summary, completion)
            if self.precise_cap is not None and self.precise_cap.applies(principal):
                # The limits first: a request they refuse must not count in the cap's window
                # (429s would pad it with "fast" and buy precise answers).
                pending = admitting or eager(self.limiter.admit(principal, reserve))
                admitting = None  # a refusal raises below: nothing to withdraw
                admitting = eager(ready(await pending))
            decision, tiers = await self._capped(decision, tiers, principal)
            if media:  # only a body with media URLs waits here (their hosts are resolved)
                await self.fields.check_media(media, tiers[0])
            ctx.decision = decision
            ctx.mark("classify")
            prepared = self._prepare(body, summary, tiers, key_cap, principal.tenant)
        except BaseException:
            if admitting is not None:
                await withdraw(admitting)
            raise
        if admitting is None:
            admission = await self.limiter.admit(principal, reserve)
        else:
            admission = await admitting
        admission, tiers = await self._budgeted(
            ctx, admission, principal, tiers, summary, completion=completion
        )
        ctx.admitted = True
        ctx.mark("ratelimit")
        ctx.extra_headers.update(admission.headers)
        bound = UsageBound.of(body_bytes, completion, summary.completions)
        return _Admitted(tiers, admission, bound, *prepared)

    async def _budgeted(
        self,
        ctx: RequestContext,
        admission: Admission,
        principal: Principal,
        tiers: tuple[str, ...],
        summary: RequestSummary,
        *,
        completion: int,
    ) -> tuple[Admission, tuple[str, ...]]:
        """The admission with the budget's reservation (``completion``: the completion cap it
        prices), and the tiers it pays for."""
        if self.budgets is None:
            return admission, tiers
        return await with_budget(
            self.budgets,
            admission,
            ctx,
            principal=principal,
            tiers=tiers,
            prompt_tokens=summary.prompt_token_estimate,
            completion_tokens=completion * summary.completions,
            movable=self._movable(principal),
        )

    def _refuse_never_fitting(
        self,
        principal: Principal,
        tiers: tuple[str, ...],
        summary: RequestSummary,
        completion: int,
    ) -> None:
        """Refuse, before any limit's verdict is awaited, a request dearer than a whole budget
        of its key on its tier and on the fast tier a precise-share cap may still move it to
        (arithmetic: no round trip), so that verdict (``x-should-retry: false``) wins over a
        spent rpm's ``retry-after``, as a request above the whole tpm does."""
        policy = principal.policy
        if self.budgets is None or (policy.budget_daily is None and policy.budget_monthly is None):
            return  # the common case: no budget, nothing to price
        candidates = (*tiers[:1], *self._movable(principal))
        refusal = self.budgets.final_refusal(
            principal, candidates, summary.prompt_token_estimate, completion * summary.completions
        )
        if refusal is not None:
            raise refusal

    def _movable(self, principal: Principal) -> tuple[str, ...]:
        """The tier a later try of a request may be moved to whatever it was routed to: the
        fast tier, where a precise-share cap applies (its window decides per request)."""
        if self.precise_cap is not None and self.precise_cap.applies(principal):
            return (self.router.catalog.fast,)
        return ()

    def _start_admission(self, principal: Principal, reserve: int) -> Eager[Admission] | None:
        """The rate-limit check, started: it is a Redis round trip (its command is written now,
        in this task), so the request is classified and its upstream body prepared while it
        is in flight, and its verdict awaited before anything is forwarded (a refused
        request's body was prepared for nothing: it is dropped). ``None`` when there is
        nothing to wait for (no limits, or in-process counters: admitted later)."""
        if self.limiter.admits_at_once(principal):
            return None
        return eager(self.limiter.admit(principal, reserve))

    async def _capped(
        self, decision: RouteDecision, tiers: tuple[str, ...], principal: Principal
    ) -> tuple[RouteDecision, tuple[str, ...]]:
        """The decision under the key's and tenant's precise-share caps (a Redis round trip
        for capped keys only), counted for the escalation gauge."""
        cap = self.precise_cap
        if cap is not None and cap.applies(principal):
            decision, tiers = await cap.apply(decision, tiers, principal)
        if self.escalation is not None:
            self.escalation.record(principal.key_id, decision.tier == self.router.catalog.precise)
        return decision, tiers

    def _classify(
        self,
        body: dict[str, Any],
        summary: RequestSummary,
        principal: Principal,
        headers: Mapping[str, str],
        completion: int,
    ) -> tuple[RouteDecision, tuple[str, ...], list[MediaUrl]]:
        """The request's route decision, the tiers its fields allow, and the media URLs whose
        hosts must still be checked (:meth:`FieldRules.check_media`) before it goes on
        (``completion``: its completion cap, which prices it on a tier)."""
        override = headers.get("x-tiergate-tier")
        decision = self._decide(summary, body, principal, override, completion)
        tiers, media = self.fields.check_now(
            body, summary.kind, principal, self.router.tiers_for(decision, principal)
        )
        return decision, tiers, media

    def _prepare(
        self,
        body: dict[str, Any],
        summary: RequestSummary,
        tiers: Sequence[str],
        key_cap: int | None,
        tenant: str,
    ) -> tuple[bool, tuple[int, ...]]:
        """The upstream body's own fields set, and its prefix blocks (http/upstream_body.py)."""
        return prepare_upstream(
            body,
            summary,
            tiers,
            key_cap,
            forwarder=self.forwarder,
            prefix=self.prefix,
            tier_defaults=self.default_max_tokens,
            salt_tenant=tenant if self.salt_per_tenant else None,
        )

    def _fit_context(
        self,
        ctx: RequestContext,
        body: dict[str, Any],
        summary: RequestSummary,
        tiers: tuple[str, ...],
    ) -> tuple[str, ...]:
        """The tiers whose context the request may fit; a 400 ``context_length_exceeded`` when
        it certainly fits none (:mod:`policies.context_window`). Serving it on a later tier
        than the one chosen is reported as a fallback, for that reason."""
        fit = fitting_tiers(body, summary, tiers, tier_contexts(self.forwarder, tiers))
        if fit and fit[0] != tiers[0]:
            ctx.extra_headers["x-tiergate-fallback-from"] = tiers[0]
            ctx.extra_headers["x-tiergate-fallback-reason"] = "context_length_exceeded"
        return fit

    def _stream(
        self,
        ctx: RequestContext,
        exchange: Exchange,
        admission: Admission,
        shadow: Shadow | None,
        bound: UsageBound,
        *,
        strip_usage: bool,
    ) -> Reply:
        """Relay an open upstream stream; settle the limits once it has ended."""
        observer = self.observer
        clip = self.clip_usage

        def ended(outcome: str, usage: Usage | None) -> None:
            ctx.usage = clip(usage, bound, ctx.tier)
            ctx.stream_cut = relay.cut
            observer.finished(ctx, outcome)

        summary = ctx.summary
        trace = ctx.trace
        relay = StreamRelay(
            exchange,
            strip_usage=strip_usage,
            idle_s=self.idle_timeouts[ctx.tier or exchange.pool.tier],
            on_close=ended,
            on_event=trace.on_event if trace is not None else None,
            prompt_tokens=summary.prompt_token_estimate if summary is not None else 0,
            max_tokens=summary.max_tokens if summary is not None else None,
            capture=shadow is not None,
            choices=summary.n * summary.prompts if summary is not None else 1,
        )

        async def after() -> None:
            await relay.close()
            usage = ctx.usage
            await admission.settle(usage.total if usage is not None else None)
            if shadow is not None and relay.complete and relay.captured is not None:
                shadow.submit("".join(relay.captured))

        ctx.status = 200
        headers = ctx.headers()
        headers["cache-control"] = "no-cache"

        async def settle() -> None:
            """``settle_first``: with the relay's usage while its [DONE] is held, else with
            what ``ended`` recorded once it closed."""
            if not relay.closed:
                ctx.usage = clip(relay.usage, bound, ctx.tier)
            usage = ctx.usage
            await admission.settle(usage.total if usage is not None else None)

        stream, first = relay.__aiter__(), settle if admission.settle_first else None
        if first is not None:
            stream = settled_before_end(stream, relay, first)
        reply = Reply(200, headers, EVENT_STREAM, stream=stream, after=after)
        reply.on_stall, reply.pump = relay.stalled, Pump(relay, settle=first)
        return reply

    async def _complete(
        self,
        ctx: RequestContext,
        opened: Opened,
        admission: Admission,
        shadow: Shadow | None,
        bound: UsageBound,
    ) -> Reply:
        raw = opened.body or b""
        # Read when the answer was checked (gateway.upstream.attempt); a completion of 0 counts
        # its text. No usage (``null``, absent: llama.cpp's list of answers): the reservation.
        reported = whole_usage(opened, bound.completion) or reserved_usage(ctx.summary, bound)
        usage = ctx.usage = self.clip_usage(reported, bound, ctx.tier)
        ctx.status = 200
        used = usage.total if usage is not None else None

        observer = self.observer

        # Recording the request (metrics, spans, the access line) and reconciling the token
        # reservation (a Redis round trip) are work the caller need not wait for: they run
        # right after the answer is written, so its duration is time to the last byte.
        def finish() -> None:
            observer.finished(ctx, Outcome.COMPLETE)

        if admission.settle_first:
            # A concurrency slot is freed (and a budget settled, its header showing what is
            # left after this answer) before the answer goes out: a caller who has the whole
            # answer never finds its slot still taken.
            await admission.settle(used)
            ctx.extra_headers.update(admission.headers)
            admission = SETTLED
        if shadow is None and not admission.settles:  # nothing to wait for afterwards
            return Reply(200, ctx.headers(), body=raw, finish=finish)

        async def after() -> None:
            await after_complete(admission, used, shadow, raw)

        return Reply(200, ctx.headers(), body=raw, after=after, finish=finish)

    def _decide(
        self,
        summary: RequestSummary,
        body: dict[str, Any],
        principal: Principal,
        override: str | None,
        completion: int,
    ) -> RouteDecision:
        decision = self.router.decide(summary, body, principal, override)
        if self.spillover is not None:
            budgets = self.budgets
            prompt, completions = summary.prompt_token_estimate, completion * summary.completions

            def accepts(tier: str) -> bool:
                """The request's fields go there, and it is not dearer there than a whole
                budget of its key (a spill must not turn a request that fits into one that
                never does)."""
                if not self.fields.accepts(body, tier):
                    return False
                if budgets is None:
                    return True
                return budgets.final_refusal(principal, (tier,), prompt, completions) is None

            decision = self.spillover.adjust(decision, principal, accepts)
        self._check_max_tokens(summary, decision.tier, principal.policy.max_tokens)
        return decision

    def _check_max_tokens(self, summary: RequestSummary, tier: str, key_cap: int | None) -> None:
        requested = summary.max_tokens
        if requested is None:
            return
        cap = self.tier_caps[tier]
        if key_cap is not None:
            cap = min(cap, key_cap)
        if requested > cap:
            raise InvalidRequest(
                f"'{summary.max_tokens_param}' is {requested}, above this route's limit of {cap}.",
                param=summary.max_tokens_param,
                code="max_tokens_exceeded",
            )


class _Attempts:
    """Records one request's upstream attempts on its context and tells its trace.

    The pipeline's listener for :meth:`Forwarder.forward`: forwarding reports values, and
    only the pipeline writes the request's context.
    """

    __slots__ = ("ctx", "tier")

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.tier: str | None = None  # the tier of the last attempt started

    def attempt_started(self, start: AttemptStart) -> Mapping[str, str]:
        """Name the attempt's replica and id on the context; the trace context to send."""
        ctx = self.ctx
        self.tier = start.tier
        ctx.replica = start.replica
        ctx.attempts += 1
        ctx.upstream_request_id = start.upstream_request_id
        ctx.prefix_match = start.prefix_match
        trace = ctx.trace
        return trace.attempt_started(ctx, start) if trace is not None else _NO_HEADERS

    def attempt_ended(self, end: AttemptEnd) -> None:
        """Count the time spent on the backend and when a stream's first event came."""
        ctx = self.ctx
        ctx.upstream_s += end.upstream_s
        if end.first_chunk_at is not None:
            ctx.first_chunk_s = end.first_chunk_at - ctx.started
        trace = ctx.trace
        if trace is not None:
            trace.attempt_ended(ctx, end)


def _check_encoding(encoding: str | None) -> None:
    """A compressed body (``Content-Encoding: gzip``...) is refused for what it is, 415, rather
    than read as bytes and refused as invalid JSON."""
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise UnsupportedMediaType(
            f"Content-Encoding '{encoding[:40]}' is not supported: send the body uncompressed."
        )


def _answered(ctx: RequestContext, forwarded: Forwarded) -> None:
    """Which tier answered, and after a fallback from which tier and why."""
    ctx.tier = forwarded.tier
    if forwarded.fallback_from is not None:
        ctx.extra_headers["x-tiergate-fallback-from"] = forwarded.fallback_from
        ctx.extra_headers["x-tiergate-fallback-reason"] = str(forwarded.fallback_reason)


class _Admitted(NamedTuple):
    """A request through the limits: its tiers, its admission, and its prepared forwarding."""

    tiers: tuple[str, ...]
    admission: Admission
    bound: UsageBound  # the most usage the backend may charge
    strip_usage: bool
    blocks: tuple[int, ...]
