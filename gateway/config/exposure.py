"""The start-up exposure self-check, with real name resolution (``tiergate check-exposure``).

The rules are pure and live in ``policies.exposure``; this module only adds the system
resolver, so DNS names that resolve to private addresses are not reported as unknown.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

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
    "resolve_all",
    "resolve_host",
]

# The most the check waits for DNS, all names together (they are looked up at once): a DNS
# server that never answers makes each lookup wait the resolver's whole timeout (5 s, twice,
# per search domain), which start-up must not pay once per backend name. A name not answered
# in time counts as unresolved (a private-looking name keeps its conventional class).
RESOLVE_WITHIN_S = 3.0


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
    """Every exposure finding for this gateway, resolving DNS names it cannot classify.

    The names the rules ask about are found by a first pass that resolves nothing, then
    looked up together (:func:`resolve_all`), at most :data:`RESOLVE_WITHIN_S` in all.
    """
    asked: list[str] = []

    def record(host: str) -> Sequence[str]:
        asked.append(host)
        return ()

    def check(resolve: exposure.Resolver) -> list[Finding]:
        return exposure.check_exposure(
            bind_host=bind_host,
            tls_in_front=tls_in_front,
            backends=backends,
            redis_url=redis_url,
            metrics_host=metrics_host,
            resolve=resolve,
        )

    check(record)
    if not asked:
        return check(record)
    answers = resolve_all(asked, RESOLVE_WITHIN_S)
    return check(lambda host: answers.get(host, ()))


def resolve_all(hosts: Iterable[str], within_s: float) -> dict[str, list[str]]:
    """The addresses of each of ``hosts``, looked up at once; a name whose lookup has not
    ended ``within_s`` after the start is left out (its thread, a daemon, is left to end)."""
    answers: dict[str, list[str]] = {}

    def look_up(host: str) -> None:
        answers[host] = resolve_host(host)

    threads = [
        threading.Thread(target=look_up, args=(host,), name="tiergate-resolve", daemon=True)
        for host in dict.fromkeys(hosts)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + within_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(answers)


def metrics_listen_host(settings: Settings) -> str | None:
    """Where the unauthenticated metrics port listens; None when there is none."""
    telemetry = settings.telemetry
    if telemetry.metrics_port is None:
        return None
    return telemetry.metrics_host or settings.server.host


def format_finding(finding: Finding) -> str:
    """One human-readable line, e.g. for ``tiergate check-exposure`` output."""
    return f"{finding.severity.value}: {finding.subject}: {finding.message} [{finding.code}]"
