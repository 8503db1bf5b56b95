"""The active exposure audit: ``tiergate check-exposure --probe``.

The configuration check (:mod:`policies.exposure`) reads addresses; this module asks the
backends themselves, from the gateway's host:

a. **A backend on this host listening on every interface.** For a replica URL (or the Redis
   URL) on a loopback address, the same port is connected to (TCP only) on each of this
   host's own non-loopback addresses. If one answers, the server is bound to ``0.0.0.0`` /
   ``::`` (vLLM's default; Ollama with ``OLLAMA_HOST=0.0.0.0``; the official Redis image),
   and anyone on that network reaches it past the gateway.
b. **Routes that answer without credentials.** Every backend is sent a keyless ``GET`` for each
   route of vLLM's open table (:data:`policies.vllm_surface.OPEN_ROUTES`) and for
   ``/v1/models``. Only ``GET``: a ``POST`` to ``/sleep`` or ``/scale_elastic_ep`` would act.
   A ``POST``-only route that exists answers ``GET`` with 405, which counts as open.

Only addresses of this machine are ever connected to in (a): each candidate is checked by
binding a socket to it, which the kernel allows only for the host's own addresses.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from policies.exposure import Finding, HostClass, Severity, classify_host
from policies.vllm_surface import OPEN_ROUTES, route_is_open

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_IF_INET6 = Path("/proc/net/if_inet6")
PROBE_TIMEOUT_S = 2.0


def _ipv4_of_interfaces() -> Iterator[str]:
    """Each interface's IPv4 address (Linux ``ioctl``; nothing elsewhere)."""
    try:
        import fcntl  # noqa: PLC0415  # Unix only, and only for the probe
    except ImportError:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # an interface without an IPv4 address
                continue
            yield socket.inet_ntoa(answer[20:24])


def _ipv6_of_interfaces() -> Iterator[str]:
    """Global and unique-local IPv6 addresses from ``/proc/net/if_inet6`` (Linux)."""
    with contextlib.suppress(OSError):
        for line in _IF_INET6.read_text(encoding="ascii").splitlines():
            digits = line.split()[0] if line.split() else ""
            if len(digits) == 32:
                yield str(ipaddress.IPv6Address(bytes.fromhex(digits)))


def _by_hostname() -> Iterator[str]:
    """What this host's name resolves to (the fallback where the above find nothing)."""
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP):
            yield str(info[4][0])


def _is_own(address: str) -> bool:
    """Whether ``address`` belongs to this machine: only then may a socket bind to it."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
    except OSError:
        return False
    return True


def host_addresses() -> list[str]:
    """This machine's own addresses other than loopback and link-local, each verified."""
    candidates = [*_ipv4_of_interfaces(), *_ipv6_of_interfaces()]
    if not candidates:
        candidates = list(_by_hostname())
    found: list[str] = []
    for address in dict.fromkeys(candidates):
        parsed = ipaddress.ip_address(address)
        if parsed.is_loopback or parsed.is_link_local or parsed.is_unspecified:
            continue
        if _is_own(address):
            found.append(address)
    return found


def _answers(address: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to ``address:port`` (one of this host's) is accepted."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


_DEFAULT_PORTS = {"https": 443, "redis": 6379, "rediss": 6379}


def _answering_elsewhere(
    url: str, addresses: Sequence[str], timeout_s: float
) -> tuple[int, list[str]] | None:
    """For a loopback ``url``: its port and which of this host's ``addresses`` accept on it."""
    parts = urlsplit(url)
    if parts.hostname is None or classify_host(parts.hostname) is not HostClass.LOOPBACK:
        return None
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
    answering = [a for a in addresses if _answers(a, port, timeout_s)]
    return (port, answering) if answering else None


def listens_everywhere(
    subject: str, url: str, addresses: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S
) -> Finding | None:
    """(a): a loopback backend whose port also answers on one of this host's ``addresses``."""
    found = _answering_elsewhere(url, addresses, timeout_s)
    if found is None:
        return None
    port, answering = found
    return Finding(
        "backend_all_interfaces",
        Severity.ERROR,
        subject,
        f"port {port} answers on this host's {', '.join(answering)} too, not only on loopback: "
        "the backend listens on every interface and anyone on that network reaches it past "
        "the gateway; start it bound to 127.0.0.1 (vLLM: --host 127.0.0.1; Ollama: "
        "OLLAMA_HOST=127.0.0.1)",
    )


def redis_listens_everywhere(
    url: str, addresses: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S
) -> Finding | None:
    """(a) for Redis: a loopback Redis URL whose port also answers on this host's addresses.

    The URL is never quoted (it may carry a password).
    """
    found = _answering_elsewhere(url, addresses, timeout_s)
    if found is None:
        return None
    port, answering = found
    return Finding(
        "redis_all_interfaces",
        Severity.ERROR,
        "redis.url",
        f"Redis port {port} answers on this host's {', '.join(answering)} too, not only on "
        "loopback: the keys and rate limits are reachable past the gateway; bind it to "
        "127.0.0.1 (redis.conf: bind 127.0.0.1 -::1)",
    )


def _get_status(url: str, path: str, timeout_s: float) -> int | None:
    """The status of a keyless ``GET`` (no redirect followed); ``None`` when none came."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        # Nothing secret is sent; an audit must read a self-signed backend's status too.
        context = ssl._create_unverified_context()  # noqa: S323
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", parts.path.rstrip("/") + path)
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def open_routes(subject: str, url: str, timeout_s: float = PROBE_TIMEOUT_S) -> list[Finding]:
    """(b): vLLM's routes that answer ``url`` without credentials, and a keyless model list."""
    models = _get_status(url, "/v1/models", timeout_s)
    if models is None:
        return [
            Finding(
                "backend_unreachable",
                Severity.WARNING,
                subject,
                "no answer to GET /v1/models: the probe could not audit this backend",
            )
        ]
    findings: list[Finding] = []
    if models == 200:
        findings.append(
            Finding(
                "backend_without_key",
                Severity.WARNING,
                subject,
                "GET /v1/models answers without a key: the inference API takes no credentials "
                "(vLLM --api-key; the gateway sends it from tiers.X.api_key)",
            )
        )
    acting: list[str] = []
    reading: list[str] = []
    for route in OPEN_ROUTES:
        status = _get_status(url, route.path, timeout_s)
        if route_is_open(status):
            (acting if route.acts else reading).append(f"{route.method} {route.path} ({status})")
    if acting:
        findings.append(
            Finding(
                "backend_open_admin_routes",
                Severity.ERROR,
                subject,
                "routes that change the engine or run the model answer without credentials: "
                f"{', '.join(acting)}; no --api-key guards them, so only the gateway may reach "
                "this port (docs/security.md)",
            )
        )
    if reading:
        findings.append(
            Finding(
                "backend_open_routes",
                Severity.WARNING,
                subject,
                f"routes that read answer without credentials: {', '.join(reading)}",
            )
        )
    return findings


def probe_backends(
    backends: Mapping[str, Sequence[str]], redis_url: str | None = None
) -> list[Finding]:
    """Every finding of (a) and (b) for the tiers' replica URLs, and (a) for Redis (pass
    ``redis_url`` only when Redis is in use)."""
    addresses = host_addresses()
    findings: list[Finding] = []
    if redis_url is not None:
        redis = redis_listens_everywhere(redis_url, addresses)
        if redis is not None:
            findings.append(redis)
    for tier, urls in backends.items():
        for index, url in enumerate(urls):
            subject = f"tiers.{tier}.replicas[{index}]"
            everywhere = listens_everywhere(subject, url, addresses)
            if everywhere is not None:
                findings.append(everywhere)
            findings.extend(open_routes(subject, url))
    return findings
