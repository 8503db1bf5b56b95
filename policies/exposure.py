"""Is anything reachable that should not be? Classify listen and upstream addresses.

vLLM's server answers unauthenticated admin endpoints (``/scale_elastic_ep`` and
``/invocations`` always; ``/pause``, ``/sleep``, ``/update_weights`` in dev mode: the table is
:data:`policies.vllm_surface.OPEN_ROUTES`) on the port the gateway forwards to, so a backend
URL on a public address means the inference port is exposed; a gateway listening on every
interface without a TLS terminator in front exposes keys in clear text. This module decides
that from plain values, without IO: name resolution is a port (``Resolver``) that the caller
supplies.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from policies.vllm_surface import ALWAYS_OPEN

# Host names that resolve inside a private network by convention: single-label names
# (compose service names, /etc/hosts entries) are handled separately.
_PRIVATE_SUFFIXES = (".svc", ".cluster.local", ".internal", ".home.arpa", ".lan")
_LOOPBACK_NAMES = ("localhost", "ip6-localhost", "ip6-loopback")

# 100.64.0.0/10 (carrier-grade NAT, also used by overlay networks) is neither "private" nor
# "global" to the ipaddress module; it is not reachable from the internet.
_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")

# One part of an IPv4 address as inet_aton(3) reads it (and so getaddrinfo, and so the HTTP
# client): hexadecimal after 0x, octal after a leading 0, decimal otherwise.
_INET_ATON_PART = re.compile(r"0x[0-9a-f]+|0[0-7]*|[1-9][0-9]*")


class HostClass(StrEnum):
    """Where an address can be reached from."""

    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link-local"
    ALL_INTERFACES = "all-interfaces"
    PUBLIC = "public"
    UNRESOLVED = "hostname-unresolved"


class Severity(StrEnum):
    """``error`` findings stop a gateway in strict mode; ``warning`` findings never do."""

    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Finding:
    """One exposure problem: a stable code, where it is configured, and what to do."""

    code: str
    severity: Severity
    subject: str
    message: str


Resolver = Callable[[str], Sequence[str]]
"""Returns the IP addresses a host name resolves to; empty when it does not resolve."""


def no_resolution(host: str) -> Sequence[str]:
    """A resolver that never resolves: every unknown DNS name stays unresolved."""
    del host
    return ()


def classify_host(host: str) -> HostClass:
    """Classify an IP literal or host name without resolving it."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if not name.isascii():
        # What the socket layer connects to: IDNA folds fullwidth digits (U+FF18 for "8") and
        # the ideographic and fullwidth full stops (U+3002) into the ASCII address they spell.
        try:
            name = name.encode("idna").decode("ascii").rstrip(".").lower()
        except UnicodeError:
            return HostClass.UNRESOLVED
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(name)
    except ValueError:
        numeric = inet_aton_address(name)
        if numeric is None:
            return _classify_name(name)
        address = numeric
    return _classify_address(address)


def inet_aton_address(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a numeric host such as ``0x08080808``, ``134744072``, ``010.8.8.8``
    or ``10.1`` denotes under inet_aton(3)'s rules; None for anything else.

    Resolvers take these spellings for addresses, not names, so they must be classified by
    the address (``134744072`` is 8.8.8.8, not a single-label private name).
    """
    parts = name.lower().split(".")
    if len(parts) > 4 or not all(_INET_ATON_PART.fullmatch(part) for part in parts):
        return None
    values = [_inet_aton_number(part) for part in parts]
    *leading, last = values
    if any(value > 0xFF for value in leading) or last >= 1 << (8 * (5 - len(values))):
        return None
    number = last
    for index, value in enumerate(leading):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _inet_aton_number(part: str) -> int:
    if part.startswith("0x"):
        return int(part[2:], 16)
    if part.startswith("0"):
        return int(part, 8)
    return int(part)


def _classify_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> HostClass:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        return HostClass.ALL_INTERFACES
    if address.is_loopback:
        return HostClass.LOOPBACK
    if address.is_link_local:
        return HostClass.LINK_LOCAL
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED_ADDRESS_SPACE:
        return HostClass.PRIVATE
    return HostClass.PUBLIC if address.is_global else HostClass.PRIVATE


def _classify_name(name: str) -> HostClass:
    if not name:
        return HostClass.UNRESOLVED
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return HostClass.LOOPBACK
    if "." not in name or name.endswith(_PRIVATE_SUFFIXES):
        return HostClass.PRIVATE
    return HostClass.UNRESOLVED


def url_host(url: str) -> str | None:
    """The host part of a URL, or ``None`` when it has none (a unix socket, a bad URL)."""
    try:
        return urlsplit(url).hostname or None
    except ValueError:  # an unbalanced IPv6 bracket
        return None


def host_classes(host: str, resolve: Resolver) -> list[HostClass]:
    """The classes of ``host``: itself when it is an address, else of what it resolves to.

    A name private or loopback only by convention (single label, ``.svc``, ``.internal``,
    ``*.localhost``...) is resolved too: a search domain, an ``/etc/hosts`` line or DNS (glibc
    does not pin ``*.localhost``) can point it at a public address, and then that address is
    what the gateway connects to. Unresolvable, it keeps its conventional class.
    """
    own = classify_host(host)
    if own in (HostClass.PRIVATE, HostClass.LOOPBACK) and not _is_numeric(host):
        resolved = [classify_host(address) for address in resolve(host)]
        return resolved if HostClass.PUBLIC in resolved else [own]
    if own is not HostClass.UNRESOLVED:
        return [own]
    resolved = [classify_host(address) for address in resolve(host)]
    return resolved or [HostClass.UNRESOLVED]


def _is_numeric(host: str) -> bool:
    """Whether ``host`` is an address literal (any inet_aton spelling, IPv6 in brackets or not)."""
    name = host.strip().strip("[]").rstrip(".").lower()
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return inet_aton_address(name) is not None
    return True


def assess_listener(host: str, classes: Sequence[HostClass], tls_in_front: bool) -> Finding | None:
    """A finding when the gateway listens where clients can reach it in clear text."""
    if tls_in_front:
        return None
    if HostClass.PUBLIC in classes:
        return Finding(
            "bind_public",
            Severity.ERROR,
            "server.host",
            f"the gateway listens on public address {host!r} without TLS in front; bind "
            "127.0.0.1 or a private address, or put a TLS proxy in front and set "
            "server.tls_terminated_upstream",
        )
    if HostClass.ALL_INTERFACES in classes:
        return Finding(
            "bind_all_interfaces",
            Severity.ERROR,
            "server.host",
            f"the gateway listens on every interface ({host!r}) without TLS in front; in a "
            "container this is expected and the published port decides the exposure (compose "
            "publishes on 127.0.0.1, the Helm chart uses a ClusterIP Service); on a host, bind "
            "127.0.0.1 or set server.tls_terminated_upstream behind a TLS proxy",
        )
    if HostClass.UNRESOLVED in classes:
        return Finding(
            "bind_unresolved",
            Severity.WARNING,
            "server.host",
            f"cannot tell whether listen host {host!r} is private",
        )
    return None


def assess_metrics_listener(host: str, classes: Sequence[HostClass]) -> Finding | None:
    """A finding when the unauthenticated metrics port listens where anyone can reach it.

    Unlike the gateway's own port, a TLS proxy in front does not cover it: it answers
    ``/metrics`` to whoever connects, so it belongs on loopback or one private address.
    """
    if HostClass.PUBLIC in classes:
        return Finding(
            "metrics_bind_public",
            Severity.ERROR,
            "telemetry.metrics_host",
            f"the unauthenticated metrics port listens on public address {host!r}; set "
            "telemetry.metrics_host to 127.0.0.1 or the address on your monitoring network",
        )
    if HostClass.ALL_INTERFACES in classes:
        return Finding(
            "metrics_bind_all_interfaces",
            Severity.ERROR,
            "telemetry.metrics_host",
            f"the unauthenticated metrics port listens on every interface ({host!r}; unset, "
            "telemetry.metrics_host is server.host), which no TLS proxy covers; set "
            "telemetry.metrics_host to 127.0.0.1 or the address on your monitoring network "
            "(compose: the telemetry network's; Kubernetes: the pod IP)",
        )
    return None


def assess_upstream(subject: str, url: str, resolve: Resolver) -> Finding | None:
    """A finding when an upstream (a vLLM replica, Redis) is not on a private network."""
    host = url_host(url)
    if host is None:
        if url.startswith("unix:"):
            return None
        # The URL itself is not echoed: a Redis URL may carry a password.
        return Finding("upstream_bad_url", Severity.ERROR, subject, "the URL has no host")
    classes = host_classes(host, resolve)
    if HostClass.PUBLIC in classes:
        return Finding(
            "upstream_public",
            Severity.ERROR,
            subject,
            f"{host!r} is a public address: the server behind it is reachable from the "
            f"internet (vLLM answers {ALWAYS_OPEN} to anyone, --api-key or not); keep it on a "
            "private network",
        )
    if HostClass.UNRESOLVED in classes:
        return Finding(
            "upstream_unresolved",
            Severity.WARNING,
            subject,
            f"cannot tell whether {host!r} is private; prefer a cluster-internal name or a "
            "private address",
        )
    if HostClass.LINK_LOCAL in classes or HostClass.ALL_INTERFACES in classes:
        return Finding(
            "upstream_unusual_address",
            Severity.WARNING,
            subject,
            f"{host!r} is a link-local or unspecified address, an unusual place for a model "
            "server (169.254.169.254 is a cloud metadata service)",
        )
    return None


def check_exposure(
    *,
    bind_host: str,
    tls_in_front: bool,
    backends: Mapping[str, Sequence[str]],
    redis_url: str | None = None,
    metrics_host: str | None = None,
    resolve: Resolver = no_resolution,
) -> list[Finding]:
    """Every exposure finding for a gateway listening on ``bind_host``.

    ``backends`` maps a tier name to its replica URLs; ``redis_url`` is checked when given
    (pass it only when Redis is in use); ``metrics_host`` is where the unauthenticated
    metrics port listens (pass it only when ``telemetry.metrics_port`` is set).
    """
    findings: list[Finding] = []
    listener = assess_listener(bind_host, host_classes(bind_host, resolve), tls_in_front)
    if listener is not None:
        findings.append(listener)
    if metrics_host is not None:
        metrics = assess_metrics_listener(metrics_host, host_classes(metrics_host, resolve))
        if metrics is not None:
            findings.append(metrics)
    for tier, urls in backends.items():
        for index, url in enumerate(urls):
            found = assess_upstream(f"tiers.{tier}.replicas[{index}]", url, resolve)
            if found is not None:
                findings.append(found)
    if redis_url is not None:
        found = assess_upstream("redis.url", redis_url, resolve)
        if found is not None:
            findings.append(found)
    return findings


def refuses_start(findings: Sequence[Finding], mode: str) -> bool:
    """Whether a gateway in exposure ``mode`` (off | warn | strict) must not start."""
    return mode == "strict" and any(f.severity is Severity.ERROR for f in findings)
