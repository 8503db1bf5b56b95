"""Refused credentials: counted by route class and reason, logged at most once per interval.

Every 401 of a missing or wrong credential, and the 403 of an API key presented where the
admin token is needed, on any route (the admin API, ``/metrics``, ``/v1/models``, the inference
endpoints), is counted in ``tiergate_auth_refusals_total{route,reason}`` and reported by an
``auth.refused`` warning: the first refusal of a route class at once, then at most one line per
class every ``interval_s``, carrying how many refusals (and of which reasons) it stands for.
Both label sets are fixed, whatever path or header a caller sends. The line carries the route
class, the reasons, the count and the client's address: never the presented credential nor
any part of it. Only refusals call in here; a request that authenticates never does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Protocol

import structlog

from gateway.telemetry import semconv as sc

REFUSAL_LOG_INTERVAL_S: Final = 10.0
ROUTE_CLASSES: Final = ("admin", "metrics", "models", "inference", "other")
# Error codes (policies.keys, gateway.access) → the reason label.
_REASON_OF_CODE: Final = {
    "missing_api_key": "missing",
    "missing_admin_token": "missing",
    "invalid_api_key": "invalid",
    "invalid_admin_token": "invalid",
    "api_key_revoked": "revoked",
    "api_key_expired": "expired",
    "admin_required": "api_key_on_admin",
}
REASONS: Final = ("missing", "invalid", "revoked", "expired", "api_key_on_admin", "other")
_INFERENCE: Final = frozenset(
    {"/v1/chat/completions", "/v1/chat/completions/", "/v1/completions", "/v1/completions/"}
)
_log = structlog.get_logger("tiergate.auth")


class _Counts(Protocol):
    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None: ...


def route_class(path: str) -> str:
    """The route class of ``path`` (one of :data:`ROUTE_CLASSES`)."""
    if path.startswith("/admin/"):
        return "admin"
    if path == "/metrics":
        return "metrics"
    if path == "/v1/models" or path.startswith("/v1/models/"):
        return "models"
    if path.partition("?")[0] in _INFERENCE:
        return "inference"
    return "other"


def reason_of(code: object) -> str:
    """The reason label of an error code (one of :data:`REASONS`)."""
    return _REASON_OF_CODE.get(code, "other") if isinstance(code, str) else "other"


class _Window:
    """One route class's refusals since its last line."""

    __slots__ = ("last", "reasons")

    def __init__(self) -> None:
        self.last: float | None = None
        self.reasons: dict[str, int] = {}


class AuthRefusals:
    """Counts refused credentials and writes the rate-limited ``auth.refused`` line."""

    def __init__(
        self,
        counter: _Counts,
        *,
        interval_s: float = REFUSAL_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counter = counter
        self.interval_s = interval_s
        self._clock = clock
        self._windows = {name: _Window() for name in ROUTE_CLASSES}

    def refused(self, path: str, code: object, client: str | None) -> None:
        """One refusal of a credential on ``path`` with the error ``code``, from ``client``."""
        route, reason = route_class(path), reason_of(code)
        self.counter.inc((route, reason))
        window = self._windows[route]
        window.reasons[reason] = window.reasons.get(reason, 0) + 1
        now = self._clock()
        if window.last is not None and now - window.last < self.interval_s:
            return
        reasons, window.reasons, window.last = window.reasons, {}, now
        _log.warning(
            sc.EV_AUTH_REFUSED,
            route=route,
            reason=reason,
            count=sum(reasons.values()),
            reasons=reasons,
            client=client,
            interval_s=self.interval_s,
        )
