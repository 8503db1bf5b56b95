"""Names that look private by convention are still checked against what they resolve to.

A single-label name (``gpu-box``, completed by the resolver's search domains or an
``/etc/hosts`` line), ``*.internal``, ``*.lan`` or ``*.svc`` says nothing certain about the
address behind it: when it resolves to a public address, the backend is reachable from the
internet, which is ``upstream_public`` (docs/deployment.md: "a replica URL or Redis resolves
to a public address"), not a pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies.exposure import (
    HostClass,
    Resolver,
    Severity,
    check_exposure,
    host_classes,
    refuses_start,
)


def _table(mapping: dict[str, list[str]]) -> Resolver:
    """A resolver backed by a fixed table (an injected port, not a patch)."""

    def resolve(host: str) -> Sequence[str]:
        return mapping.get(host, [])

    return resolve


PUBLIC_BEHIND_PRIVATE_NAMES = _table(
    {
        "gpu-box": ["8.8.8.8"],
        "vllm.internal": ["10.0.0.5", "2001:4860:4860::8888"],
        "redis.lan": ["1.1.1.1"],
        "vllm-fast.llm.svc": ["203.0.113.9", "8.8.4.4"],
        "edge": ["9.9.9.9"],
    }
)


@pytest.mark.parametrize("name", ["gpu-box", "vllm.internal", "vllm-fast.llm.svc"])
def test_a_conventionally_private_name_resolving_publicly_is_upstream_public(name: str) -> None:
    """A replica whose private-looking name resolves to a public address is an error."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={"fast": [f"http://{name}:8000"]},
        resolve=PUBLIC_BEHIND_PRIVATE_NAMES,
    )
    assert [(f.code, f.severity, f.subject) for f in findings] == [
        ("upstream_public", Severity.ERROR, "tiers.fast.replicas[0]")
    ]
    assert refuses_start(findings, "strict")


def test_a_redis_name_resolving_publicly_is_upstream_public() -> None:
    """The same for Redis, without echoing the URL's password."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={},
        redis_url="redis://:hunter2@redis.lan:6379/0",
        resolve=PUBLIC_BEHIND_PRIVATE_NAMES,
    )
    assert [f.code for f in findings] == ["upstream_public"]
    assert "hunter2" not in findings[0].message


def test_a_listen_name_resolving_publicly_is_bind_public() -> None:
    """A single-label listen host resolving to a public address is bind_public."""
    findings = check_exposure(
        bind_host="edge", tls_in_front=False, backends={}, resolve=PUBLIC_BEHIND_PRIVATE_NAMES
    )
    assert [f.code for f in findings] == ["bind_public"]


def test_conventional_names_stay_private_when_they_resolve_privately_or_not_at_all() -> None:
    """Unresolvable (a compose name seen from outside) or private results: still private."""
    resolve = _table({"sim-fast": ["172.30.0.4"], "vllm.internal": ["10.0.0.5"]})
    assert host_classes("sim-fast", resolve) == [HostClass.PRIVATE]
    assert host_classes("vllm.internal", resolve) == [HostClass.PRIVATE]
    assert host_classes("redis", resolve) == [HostClass.PRIVATE]
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={"fast": ["http://sim-fast:8101", "http://vllm.internal:8000"]},
        redis_url="redis://redis:6379/0",
        resolve=resolve,
    )
    assert findings == []


def test_a_localhost_subdomain_resolving_publicly_is_upstream_public() -> None:
    """glibc sends `*.localhost` to DNS like any name: a public answer is what it connects to."""
    resolve = _table({"api.localhost": ["8.8.8.8"], "localhost": ["127.0.0.1", "::1"]})
    findings = check_exposure(
        bind_host="localhost",
        tls_in_front=False,
        backends={"fast": ["http://api.localhost:8000", "http://localhost:8001"]},
        resolve=resolve,
    )
    assert [(f.code, f.subject) for f in findings] == [
        ("upstream_public", "tiers.fast.replicas[0]")
    ]
    assert host_classes("localhost", resolve) == [HostClass.LOOPBACK]
