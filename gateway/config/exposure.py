"""The start-up exposure self-check, with real name resolution (``tiergate check-exposure``).

The rules are pure and live in ``policies.exposure``; this module only adds the system
resolver, so DNS names that resolve to private addresses are not reported as unknown.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from gateway.config.settings import Settings
from policies import exposure
from policies.exposure import Finding, Severity, refuses_start

__all__ = [
    "Finding",
    "Severity",
    "check_exposure",
    "format_finding",
    "metrics_listen_host",
    "refuses_start",
    "resolve_host",
]


def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` resolves to through the system resolver; empty on failure."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):  # gaierror is an OSError; an over-long label a UnicodeError
        return []
    return sorted({str(info[4][0]) for info in infos})


def check_exposure(
    *,
    bind_host: str,
    tls_in_front: bool,
    backends: Mapping[str, Sequence[str]],
    redis_url: str | None = None,
    metrics_host: str | None = None,
) -> list[Finding]:
    """Every exposure finding for this gateway, resolving DNS names it cannot classify."""
    return exposure.check_exposure(
        bind_host=bind_host,
        tls_in_front=tls_in_front,
        backends=backends,
        redis_url=redis_url,
        metrics_host=metrics_host,
        resolve=resolve_host,
    )


def metrics_listen_host(settings: Settings) -> str | None:
    """Where the unauthenticated metrics port listens; None when there is none."""
    telemetry = settings.telemetry
    if telemetry.metrics_port is None:
        return None
    return telemetry.metrics_host or settings.server.host


def format_finding(finding: Finding) -> str:
    """One human-readable line, e.g. for ``tiergate check-exposure`` output."""
    return f"{finding.severity.value}: {finding.subject}: {finding.message} [{finding.code}]"
