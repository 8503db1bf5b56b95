"""The caller's error when no replica could serve: which tier was asked, which were tried, why.

Only our own texts, replica labels (tier and place, ``fast#2``: never an address of the
inference network) and the backends' error messages (already passed to callers) go into these
messages; never a credential.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.pipeline.events import TIMEOUTS, FailureKind
from gateway.upstream.attempt import AUTH_STATUSES, AttemptFailed
from gateway.upstream.replicas import ReplicaPool
from policies.errors import (
    Overloaded,
    TierGateError,
    UpstreamBadAnswer,
    UpstreamRejected,
    UpstreamUnavailable,
)

_MAX_NAMED = 8  # replicas named in one message; the rest are counted


def why_none(pool: ReplicaPool, now: float) -> str:
    """Each replica of a tier with nothing usable, and why it is not usable."""
    replicas = pool.replicas
    named = "; ".join(
        f"replica {r.label} {r.unavailable_reason(now) or 'already tried'}"
        for r in replicas[:_MAX_NAMED]
    )
    more = len(replicas) - _MAX_NAMED
    return f"{named}; and {more} more" if more > 0 else named


def tier_detail(tier: str, last: AttemptFailed, failures: Sequence[AttemptFailed]) -> str:
    """What went wrong on one tier, for a message that names several tiers."""
    if last.kind == FailureKind.NO_REPLICA:
        prefix = f"No healthy replica in tier '{tier}': "
        reasons = last.message.removeprefix(prefix)
        return f"no healthy replica: {reasons}" if reasons != last.message else last.message
    return _attempts_detail(failures)


def _attempts_detail(failures: Sequence[AttemptFailed]) -> str:
    """What the attempts on a tier met, in order, each distinct answer once (with a count)."""
    seen: dict[str, int] = {}
    for f in failures:
        text = (
            f"replica {f.replica or '?'}: {f.message.rstrip('.')}"
            if f.kind != FailureKind.NO_REPLICA
            else f.message.rstrip(".")
        )
        seen[text] = seen.get(text, 0) + 1
    return "; ".join(
        text if count == 1 else f"{text} (x{count})"
        for text, count in list(seen.items())[:_MAX_NAMED]
    )


def _summary(error: TierGateError) -> str:
    """One tier's part of a message that sums up several: its own words, then the detail."""
    message, detail = error.message.rstrip("."), (error.detail or "").rstrip(".")
    if not detail or detail == message:
        return message
    if detail.startswith("no healthy replica: "):
        return detail
    return f"{message} ({detail})"


def every_tier_failed(failed: list[tuple[str, TierGateError]]) -> TierGateError:
    """The caller's error when no tier could serve: the last tier's kind of error, with a
    message naming the tier asked for, every fallback tier tried, and why each failed.

    The caller empties ``failed`` once it is done with it: its frame must not keep the errors
    (and through their tracebacks the request body) alive.
    """
    _, last = failed[-1]
    parts = [
        f"tier '{name}' ({'asked' if index == 0 else 'fallback'}): {_summary(error)}"
        for index, (name, error) in enumerate(failed)
    ]
    if len(parts) == 1:
        detail = last.detail or ""
        if detail and detail != last.message and not detail.startswith("no healthy replica: "):
            last.message = f"{last.message.rstrip('.')} ({detail.rstrip('.')})."
            last.args = (last.message,)
        return last
    last.message = f"No tier could serve the request. {'; '.join(parts)}."
    last.args = (last.message,)
    return last


def final_error(
    tier: str, failure: AttemptFailed, failures: Sequence[AttemptFailed] = ()
) -> TierGateError:
    """The caller's error once a tier gave up; its ``code`` doubles as the fallback reason.

    Its ``detail`` says what every attempt on the tier met (``failures``), for a message that
    sums up several tiers.
    """
    detail = tier_detail(tier, failure, failures or (failure,))
    status = failure.status
    if failure.kind == FailureKind.BAD_ANSWER:
        return UpstreamBadAnswer(
            f"The '{tier}' tier's answer could not be passed on: {failure.message}",
            detail=detail,
        )
    if status in AUTH_STATUSES:
        return UpstreamUnavailable(
            f"The backend refused the gateway's credentials (HTTP {status}): check the "
            f"upstream API key of the '{tier}' tier (tiers.{tier}.api_key or api_key_file).",
            status=502,
            code="upstream_auth_failed",
            detail=detail,
        )
    if status is not None and 400 <= status < 500 and status != 429:
        body = failure.body or {}
        param = body.get("param") if isinstance(body.get("param"), str) else None
        code = body.get("code") if isinstance(body.get("code"), str) else None
        return UpstreamRejected(
            failure.message, status=status, param=param, code=code, detail=detail
        )
    return _unavailable(tier, failure, detail)


def _unavailable(tier: str, failure: AttemptFailed, detail: str) -> TierGateError:
    """The error of a tier that could not answer (no replica, busy, timed out, broken).

    Its Retry-After is the gateway's own (a backend's was clamped in ``Forwarder._record_failure``).
    """
    retry_after = {"Retry-After": str(max(1, math.ceil(failure.retry_after or 1)))}
    if failure.kind == FailureKind.NO_REPLICA:
        return UpstreamUnavailable(
            failure.message,
            status=503,
            code="no_healthy_replica",
            headers=retry_after,
            detail=detail,
        )
    if failure.status in (429, 503):
        return Overloaded(
            f"Every replica of the '{tier}' tier is busy; retry shortly.",
            headers=retry_after,
            detail=detail,
        )
    if failure.kind in TIMEOUTS:
        return UpstreamUnavailable(
            f"The '{tier}' tier did not answer in time.",
            status=504,
            code="upstream_timeout",
            detail=detail,
        )
    return UpstreamUnavailable(
        f"The '{tier}' tier could not serve the request: {failure.message}",
        status=502,
        detail=detail,
    )
