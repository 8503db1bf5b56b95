"""Shadow evaluation: a sample of requests is also answered by the other tier, off the path.

Fast-routed requests shadowed on precise ask "did we under-route?"; precise-routed ones
shadowed on fast ask "did we over-route?". The caller's response never waits for a shadow:
it is started after the answer went out, it is never retried, never charged to the caller's
limits, bounded in concurrency, and skipped when the target tier has no idle capacity (the
in-flight counts and the scraped ``num_requests_waiting`` of its replicas). Each outcome — the
two answers' agreement (``policies/agreement.py``), the route score and the direction — goes to
the metrics, a rolling window for ``/admin/routing`` and, if configured, the bounded store of
``gateway/routing/shadow_store.py`` (the router's feature vector, no prompt text). What each
shadow answer and judge call spent goes to ``on_usage`` (the usage ledger, apart from every
tenant): its reported usage; its worst case (prompt estimate and cap) when it reports none, or
when it timed out or was cut after it was sent (the backend may have generated up to the cap);
nothing when no byte was sent or the backend answered an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextvars import Context
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import structlog

from gateway.pipeline.events import NOT_SENT, Usage
from gateway.pipeline.tasks import stop_tasks
from gateway.pipeline.usage_bound import UsageBound
from gateway.routing.shadow_store import (
    Featurizer,
    RequestFeatures,
    ShadowRecord,
    ShadowStore,
    rotated,
)
from gateway.upstream.attempt import (
    MAX_COUNT,
    AttemptFailed,
    attempt,
    choice_text,
    usage_fields,
)
from gateway.upstream.backends import kind_of
from gateway.upstream.forwarding import TierRoute
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import Replica
from policies.agreement import EMPTY, agreement, readable
from policies.judge import MAX_TOKENS as JUDGE_MAX_TOKENS
from policies.judge import judge_messages, parse_score
from policies.requests import validate
from policies.shadow_budget import TenantSampleBudget

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
UNDER = "fast_on_precise"  # a fast-routed request, answered again by precise
OVER = "precise_on_fast"  # a precise-routed request, answered again by fast
JUDGE = "judge"  # the precise tier grading a fast answer (counted like a direction)
# What a call is for, in the usage report (gateway/limits/usage.py, SHADOW_PURPOSES).
ANSWER_PURPOSE = "answer"
JUDGE_PURPOSE = "judge"
# Prompt tokens a backend may add to a body's own (as for callers: gateway/pipeline/usage_bound.py).
_PROMPT_ALLOWANCE = UsageBound.of(0, 0, 1).prompt
# Re-exported: the record types live in gateway/routing/shadow_store.py.
__all__ = [
    "JUDGE",
    "OVER",
    "UNDER",
    "Featurizer",
    "RequestFeatures",
    "ShadowConfig",
    "ShadowRecord",
    "ShadowRunner",
    "ShadowStore",
    "answer_text",
    "rotated",
    "score_bucket",
]

_log = structlog.get_logger("tiergate.shadow")


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """``router.shadow`` settings."""

    fast_ratio: float = 0.0
    precise_ratio: float = 0.0
    max_concurrent: int = 4
    max_waiting: float = 0.0
    timeout_s: float = 60.0
    window: int = 1000
    store: Path | None = None
    max_records: int = 20_000
    store_prompts: bool = False
    judge_ratio: float = 0.0
    judge_fields: Mapping[str, Any] = field(default_factory=dict)
    digest_key_file: Path | None = None
    tenant_samples_per_minute: int | None = 30

    @property
    def enabled(self) -> bool:
        """True when either direction samples anything."""
        return self.fast_ratio > 0 or self.precise_ratio > 0


@dataclass(frozen=True, slots=True)
class _Job:
    """One shadow to run: the answered request and where to send it again."""

    direction: str
    target: str
    replica: Replica
    path: str
    body: dict[str, Any]
    primary: str
    score: float | None
    worst: Usage  # what it may cost at most: the prompt estimate and the completion cap
    tenant: str | None  # the caller's tenant (never its key), written into the record


def answer_text(raw: bytes) -> str | None:
    """The first choice's text of a non-streaming chat or completion answer."""
    return choice_text(raw, "message")


class ShadowRunner:
    """Samples finished requests and answers them again on the other tier."""

    def __init__(
        self,
        config: ShadowConfig,
        routes: Mapping[str, TierRoute],
        *,
        fast_tier: str,
        precise_tier: str,
        upstream: Callable[[], UpstreamPool | None],
        on_outcome: Callable[[str, str, ShadowRecord | None], None] = lambda *_: None,
        on_usage: Callable[[str, str, Usage], None] = lambda *_: None,
        rng: random.Random | None = None,
        featurizer: Featurizer | None = None,
    ) -> None:
        self.config = config
        self.featurizer = featurizer
        self.routes = routes
        self.fast_tier = fast_tier
        self.precise_tier = precise_tier
        self.upstream = upstream
        self.on_outcome = on_outcome
        self.on_usage = on_usage  # (tier, purpose, usage) of each call that may have spent
        self.rng = rng or random.Random()  # noqa: S311  # sampling, not security
        self.running = 0
        self.recent: deque[ShadowRecord] = deque(maxlen=config.window)
        self.counts: dict[str, int] = {}
        # (direction, route-score bucket) -> [count, sum of agreement], for the metrics
        self.agreement_totals: dict[tuple[str, str], list[float]] = {}
        self.store = ShadowStore(config.store, config.max_records) if config.store else None
        self.digest_key = digest_key(config)
        self.tenant_budget = TenantSampleBudget(config.tenant_samples_per_minute)
        self._tasks: set[asyncio.Task[None]] = set()

    def sample(self, tier: str) -> str | None:
        """The direction to shadow a request answered by ``tier`` in, or ``None`` (not sampled)."""
        if tier == self.fast_tier:
            ratio, direction = self.config.fast_ratio, UNDER
        elif tier == self.precise_tier:
            ratio, direction = self.config.precise_ratio, OVER
        else:
            return None
        return direction if ratio > 0 and self.rng.random() < ratio else None

    def admit(self, direction: str, tenant: str) -> bool:
        """Whether ``tenant`` may take one more shadow sample this minute (counted when so);
        a refusal is counted as outcome ``skipped_tenant_budget``."""
        if self.tenant_budget.take(tenant):
            return True
        self._count(direction, "skipped_tenant_budget")
        return False

    def _count(self, direction: str, outcome: str, record: ShadowRecord | None = None) -> None:
        key = f"{direction}:{outcome}"
        self.counts[key] = self.counts.get(key, 0) + 1
        self.on_outcome(direction, outcome, record)

    def _idle_replica(self, tier: str) -> Replica | None:
        pool = self.routes[tier].pool
        now = time.monotonic()
        idle = [
            r
            for r in pool.usable(now)
            if r.has_capacity
            and r.waiting <= self.config.max_waiting
            # One generation at a time (llama-cpp-python): a shadow would wait behind the
            # caller's answer, and make that server cut the caller's stream short.
            and not (r.in_flight > 0 and kind_of(r).serial)
        ]
        return min(idle, key=lambda r: r.in_flight, default=None)

    def target_of(self, direction: str) -> str:
        """The tier a shadow in ``direction`` is sent to."""
        return self.precise_tier if direction == UNDER else self.fast_tier

    def submit(
        self,
        direction: str,
        path: str,
        body: dict[str, Any],
        primary: str,
        score: float | None,
        *,
        max_tokens: int | None = None,
        prompt_tokens: int = 0,
        completions: int = 1,
        tenant: str | None = None,
    ) -> None:
        """Start the shadow of one answered request, unless capacity says skip.

        ``max_tokens`` caps the shadow's completion (the target tier's limit). Its worst case
        (``prompt_tokens``, the caller's estimate, and the capped ``max_tokens`` for each of
        its ``completions``) is what it counts when its answer reports no usage or it may have
        run without answering. ``tenant`` (the caller's) goes into the record.
        """
        if self.running >= self.config.max_concurrent:
            self._count(direction, "skipped_concurrency")
            return
        target = self.target_of(direction)
        if max_tokens is not None:
            body = _capped(body, max_tokens)
        replica = self._idle_replica(target)
        upstream = self.upstream()
        if replica is None or upstream is None:
            self._count(direction, "skipped_busy")
            return
        self.routes[target].pool.lease(replica)
        self.running += 1
        worst = Usage(prompt_tokens, _completion_cap(body) * max(1, completions))
        job = _Job(direction, target, replica, path, body, primary, score, worst, tenant)
        task = asyncio.get_running_loop().create_task(
            self._run(upstream, job),
            context=Context(),  # no request's log or trace context
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, upstream: UpstreamPool, job: _Job) -> None:
        route = self.routes[job.target]
        body = job.body
        shadow_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        shadow_body["model"] = route.served_model
        headers = {"Content-Type": "application/json", "x-tiergate-shadow": job.direction}
        answer = await self._ask(
            upstream,
            job.target,
            job.replica,
            (job.path, _encoder.encode(shadow_body), headers),
            ANSWER_PURPOSE,
            job.worst,
        )
        text = answer_text(answer) if answer is not None else None
        if text is None:
            self._count(job.direction, "failed")
            return
        if not text.strip() and not job.primary.strip():
            # Neither answered anything (a reasoning model thought until max_tokens on both
            # tiers): no agreement to record, nor a judge to ask.
            self._count(job.direction, EMPTY)
            return
        prompt = _prompt_of(body)
        judged = None
        if self.config.judge_ratio > 0 and self.rng.random() < self.config.judge_ratio:
            fast_answer, precise_answer = (
                (job.primary, text) if job.direction == UNDER else (text, job.primary)
            )
            judged = await self.judge(upstream, prompt, precise_answer, fast_answer)
        self.record(
            job.direction,
            job.target,
            job.primary,
            text,
            job.score,
            prompt=prompt,
            body=body,
            judge=judged,
            tenant=job.tenant,
        )

    async def _ask(  # noqa: PLR0917  # one call, as its two callers know it
        self,
        upstream: UpstreamPool,
        tier: str,
        replica: Replica,
        request: tuple[str, bytes, dict[str, str]],
        purpose: str,
        worst: Usage,
    ) -> bytes | None:
        """One attempt on ``replica`` (leased by the caller, released here): the answer, or
        ``None`` when it failed; what it spent goes to ``on_usage`` (see the module)."""
        route = self.routes[tier]
        path, payload, headers = request
        try:
            opened = await attempt(
                upstream,
                replica.url + path,
                payload,
                headers,
                stream=False,
                timeout_s=self.config.timeout_s,
                connect_s=route.timeouts.connect_s,
            )
        except AttemptFailed as failure:
            _heard(replica, failure)
            if failure.status is None and failure.kind not in NOT_SENT:
                self.on_usage(tier, purpose, worst)  # sent, no answer: it may have run
            return None
        except asyncio.CancelledError:  # shutdown: the backend may have run (vLLM aborts it)
            self.on_usage(tier, purpose, worst)
            raise
        finally:
            route.pool.release(replica)
            self.running -= 1
        _heard(replica)
        reported = usage_fields(opened.usage)
        bound = UsageBound(len(payload) + _PROMPT_ALLOWANCE, worst.completion_tokens or MAX_COUNT)
        self.on_usage(tier, purpose, worst if reported is None else bound.clip(reported))
        return opened.body or b""

    async def judge(
        self, upstream: UpstreamPool, question: str, reference: str, candidate: str
    ) -> float | None:
        """The precise tier's rubric score of ``candidate`` (``policies/judge.py``), or None.

        One attempt on an idle precise replica, within ``max_concurrent``; outcomes are
        counted under ``judge`` (``scored``, ``unparsed``, ``failed``, ``skipped_busy``).
        """
        replica = self._idle_replica(self.precise_tier)
        if replica is None or self.running >= self.config.max_concurrent:
            self._count(JUDGE, "skipped_busy")
            return None
        route = self.routes[self.precise_tier]
        body = {
            **self.config.judge_fields,  # the operator's (thinking off); the rest is ours
            "model": route.served_model,
            "messages": judge_messages(question, readable(reference), readable(candidate)),
            "max_tokens": JUDGE_MAX_TOKENS,
            "temperature": 0,
        }
        worst = Usage(validate(dict(body), "chat").prompt_token_estimate, JUDGE_MAX_TOKENS)
        headers = {"Content-Type": "application/json", "x-tiergate-shadow": JUDGE}
        route.pool.lease(replica)
        self.running += 1
        answer = await self._ask(
            upstream,
            self.precise_tier,
            replica,
            ("/v1/chat/completions", _encoder.encode(body), headers),
            JUDGE_PURPOSE,
            worst,
        )
        if answer is None:
            self._count(JUDGE, "failed")
            return None
        reply = answer_text(answer)
        score = parse_score(reply) if reply is not None else None
        self._count(JUDGE, "failed" if reply is None else "unparsed" if score is None else "scored")
        return score

    def record(
        self,
        direction: str,
        shadow_tier: str,
        primary: str,
        shadow: str,
        score: float | None,
        *,
        prompt: str,
        body: Mapping[str, Any] | None = None,
        judge: float | None = None,
        tenant: str | None = None,
    ) -> ShadowRecord:
        """Compare two answers and keep the outcome (metrics, rolling window, store).

        With a featurizer and the request ``body``, the record carries the router's hashed
        feature vector of the request; the prompt text only when ``store_prompts`` is on.
        """
        result = agreement(primary, shadow)
        tier = self.fast_tier if direction == UNDER else self.precise_tier
        feats = self.featurizer(body) if self.featurizer is not None and body is not None else None
        record = ShadowRecord(
            time.time(),
            direction,
            tier,
            shadow_tier,
            score,
            result.score,
            result.method,
            prompt_digest(prompt, self.digest_key),
            feature_space=feats.feature_space if feats is not None else None,
            artifact=feats.artifact if feats is not None else None,
            features={"index": feats.index, "value": feats.value} if feats is not None else None,
            prompt=prompt if self.config.store_prompts else None,
            judge=judge,
            tenant=tenant,
        )
        self.recent.append(record)
        totals = self.agreement_totals.setdefault((direction, score_bucket(score)), [0, 0.0])
        totals[0] += 1
        totals[1] += result.score
        if self.store is not None:
            with contextlib.suppress(OSError):  # a full disk must not break serving
                self.store.append(record)
        self._count(direction, "compared", record)
        return record

    def routing_view(self) -> dict[str, Any]:
        """The rolling estimates for ``/admin/routing``."""
        under = [r.agreement for r in self.recent if r.direction == UNDER]
        over = [r.agreement for r in self.recent if r.direction == OVER]
        judged = [r.judge for r in self.recent if r.judge is not None]
        return {
            "shadow": {
                "fast_ratio": self.config.fast_ratio,
                "precise_ratio": self.config.precise_ratio,
                "running": self.running,
                "outcomes": dict(sorted(self.counts.items())),
            },
            # Agreement of fast answers with what precise would have said, on fast traffic.
            "quality_retained": _mean(under),
            "fast_agrees_on_precise_traffic": _mean(over),
            "samples": {UNDER: len(under), OVER: len(over)},
            # The precise tier's rubric score of fast answers, on the judged sample.
            "judge": {
                "ratio": self.config.judge_ratio,
                "mean_score": _mean(judged),
                "samples": len(judged),
            },
        }

    async def close(self) -> None:
        """Cancel shadows still running (shutdown)."""
        await stop_tasks(*self._tasks)


def _heard(replica: Replica, failure: AttemptFailed | None = None) -> None:
    """The replica answered (an error answer too): alive, for the health monitor's busy rule."""
    if failure is None or failure.status is not None:
        replica.heard_at = time.monotonic()


def _capped(body: dict[str, Any], cap: int) -> dict[str, Any]:
    """A copy of ``body`` whose completion limits are at most ``cap``."""
    out = dict(body)
    for name in ("max_tokens", "max_completion_tokens"):
        value = out.get(name)
        out[name] = cap if not isinstance(value, int) or value > cap else value
    if "max_completion_tokens" not in body:
        out.pop("max_completion_tokens")
    return out


def _completion_cap(body: Mapping[str, Any]) -> int:
    """The completion tokens ``body`` allows (0 when it names no limit)."""
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and value > 0 else 0


def score_bucket(score: float | None) -> str:
    """The route-score bucket of a record: ``0.0`` .. ``0.9`` (tenths), or ``none``."""
    if score is None:
        return "none"
    return f"{min(int(score * 10), 9) / 10:.1f}"


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _prompt_of(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                return content if isinstance(content, str) else json.dumps(content)
        return ""
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def prompt_digest(text: str, key: bytes) -> str:
    """HMAC-SHA-256 of the whitespace-normalised prompt under the deployment's digest key,
    96 bits: records of one prompt still match, but nobody without the key can confirm a
    guessed prompt (an unkeyed hash of "hi" is the same in every deployment)."""
    normalised = " ".join(text.split()).encode()
    return hmac.new(key, normalised, hashlib.sha256).hexdigest()[:24]


DIGEST_KEY_BYTES = 32


def digest_key(config: ShadowConfig) -> bytes:
    """The deployment secret that keys prompt digests.

    ``digest_key_file`` when set (it must exist); else, with a store, ``<store>.key``, created
    with a random key (mode 0600, a warning) when absent, so every worker and restart writing
    that store uses one key; else (records in memory only) a random key for this process.
    """
    path = config.digest_key_file
    if path is not None:
        key = path.read_bytes().strip()
        if len(key) < MIN_DIGEST_KEY_BYTES:
            raise ValueError(f"{path}: a digest key has at least {MIN_DIGEST_KEY_BYTES} bytes")
        return key
    if config.store is None:
        return secrets.token_bytes(DIGEST_KEY_BYTES)
    path = config.store.with_name(config.store.name + ".key")
    fresh = secrets.token_hex(DIGEST_KEY_BYTES).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as fh:
        fh.write(fresh)
    _log.warning(
        "shadow.digest_key_generated",
        path=str(path),
        hint="set router.shadow.digest_key_file to a secret of your own",
    )
    return fresh


MIN_DIGEST_KEY_BYTES = 16
