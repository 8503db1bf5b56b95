"""Exposure rules: address classes, listener and upstream findings, strict-mode refusal."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies.exposure import (
    Finding,
    HostClass,
    Resolver,
    Severity,
    check_exposure,
    classify_host,
    host_classes,
    inet_aton_address,
    refuses_start,
    url_host,
)


def _table(mapping: dict[str, list[str]]) -> Resolver:
    """A resolver backed by a fixed table (an injected port, not a patch)."""

    def resolve(host: str) -> Sequence[str]:
        return mapping.get(host, [])

    return resolve


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", HostClass.LOOPBACK),
        ("::1", HostClass.LOOPBACK),
        ("[::1]", HostClass.LOOPBACK),
        ("localhost", HostClass.LOOPBACK),
        ("LocalHost.", HostClass.LOOPBACK),
        ("api.localhost", HostClass.LOOPBACK),
        ("10.1.2.3", HostClass.PRIVATE),
        ("172.16.0.9", HostClass.PRIVATE),
        ("192.168.1.20", HostClass.PRIVATE),
        ("100.64.3.4", HostClass.PRIVATE),
        ("fd12:3456::1", HostClass.PRIVATE),
        ("169.254.169.254", HostClass.LINK_LOCAL),
        ("fe80::1", HostClass.LINK_LOCAL),
        ("0.0.0.0", HostClass.ALL_INTERFACES),
        ("::", HostClass.ALL_INTERFACES),
        ("8.8.8.8", HostClass.PUBLIC),
        ("2001:4860:4860::8888", HostClass.PUBLIC),
        ("::ffff:8.8.8.8", HostClass.PUBLIC),
        ("::ffff:10.0.0.1", HostClass.PRIVATE),
        ("vllm-fast", HostClass.PRIVATE),
        ("vllm-fast.inference.svc", HostClass.PRIVATE),
        ("vllm.inference.svc.cluster.local", HostClass.PRIVATE),
        ("db.corp.internal", HostClass.PRIVATE),
        ("vllm.example.com", HostClass.UNRESOLVED),
        ("", HostClass.UNRESOLVED),
    ],
)
def test_classify_host(host: str, expected: HostClass) -> None:
    """IP literals are classified by range, names by private-network naming conventions."""
    assert classify_host(host) is expected


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("0x08080808", "8.8.8.8"),
        ("0X08080808", "8.8.8.8"),
        ("134744072", "8.8.8.8"),
        ("010.010.010.010", "8.8.8.8"),
        ("0x8.0x8.0x8.0x8", "8.8.8.8"),
        ("8.8.2056", "8.8.8.8"),
        ("8.526344", "8.8.8.8"),
        ("10.1", "10.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("4294967295", "255.255.255.255"),
    ],
)
def test_inet_aton_address_reads_numeric_hosts_as_resolvers_do(host: str, address: str) -> None:
    """Hex, octal, dotless decimal and short dotted forms denote the address inet_aton gives."""
    assert str(inet_aton_address(host)) == address


@pytest.mark.parametrize(
    "host",
    ["vllm-fast", "1e100", "0x", "08.8.8.8", "256.1.1.1", "1.2.3.4.5", "4294967296", "1..2", ""],
)
def test_inet_aton_address_leaves_names_and_invalid_numbers_alone(host: str) -> None:
    """Names, out-of-range parts and malformed numbers are not addresses."""
    assert inet_aton_address(host) is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("0x08080808", HostClass.PUBLIC),
        ("134744072", HostClass.PUBLIC),
        ("010.010.010.010", HostClass.PUBLIC),
        ("8.8.2056", HostClass.PUBLIC),
        ("0x0a000001", HostClass.PRIVATE),
        ("167772161", HostClass.PRIVATE),
        ("2130706433", HostClass.LOOPBACK),
        ("0xA9FEA9FE", HostClass.LINK_LOCAL),
        ("0", HostClass.ALL_INTERFACES),
    ],
)
def test_classify_host_numeric_forms_by_the_address_they_denote(
    host: str, expected: HostClass
) -> None:
    """A numeric host inet_aton accepts is classified by its address, never as a private name."""
    assert classify_host(host) is expected


def test_a_dotless_public_replica_is_upstream_public_without_resolution() -> None:
    """``http://134744072:8000`` (8.8.8.8) is an upstream_public error even with no resolver."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={"fast": ["http://134744072:8000", "http://0x08080808:8000"]},
    )
    assert [f.code for f in findings] == ["upstream_public", "upstream_public"]
    assert all(f.severity is Severity.ERROR for f in findings)


def test_url_host_handles_ipv6_credentials_and_sockets() -> None:
    """The host is taken from the URL authority; URLs without one give None."""
    assert url_host("http://[fd00::5]:8000/v1") == "fd00::5"
    assert url_host("redis://:secret@redis.internal:6379/0") == "redis.internal"
    assert url_host("unix:///run/redis.sock") is None
    assert url_host("http://[::1") is None


def test_unknown_names_are_classified_by_what_they_resolve_to() -> None:
    """A DNS name resolving to a public address counts as public; unresolvable stays unknown."""
    resolve = _table({"vllm.example.com": ["10.0.0.7", "8.8.4.4"]})
    assert host_classes("vllm.example.com", resolve) == [HostClass.PRIVATE, HostClass.PUBLIC]
    assert host_classes("nowhere.example.org", resolve) == [HostClass.UNRESOLVED]
    assert host_classes("vllm-fast", resolve) == [HostClass.PRIVATE]


def test_loopback_gateway_with_private_backends_has_no_findings() -> None:
    """The default deployment shape (127.0.0.1, private replicas, in-cluster Redis) is clean."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={"fast": ["http://vllm-fast:8000"], "precise": ["http://10.0.0.5:8000"]},
        redis_url="redis://redis.tiergate.svc.cluster.local:6379/0",
    )
    assert findings == []


def test_public_backend_is_an_error_naming_the_replica() -> None:
    """A replica on a public address is an error whose subject names the tier and index."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={"fast": ["http://10.0.0.4:8000", "https://34.120.1.1:8000"]},
    )
    assert [(f.code, f.severity, f.subject) for f in findings] == [
        ("upstream_public", Severity.ERROR, "tiers.fast.replicas[1]")
    ]


def test_unknown_dns_backend_is_only_a_warning() -> None:
    """A DNS name that cannot be classified warns but never stops a strict gateway."""
    findings = check_exposure(
        bind_host="127.0.0.1", tls_in_front=False, backends={"precise": ["http://gpu.example.com"]}
    )
    assert [(f.code, f.severity) for f in findings] == [("upstream_unresolved", Severity.WARNING)]
    assert not refuses_start(findings, "strict")


def test_public_redis_is_an_error_without_echoing_credentials() -> None:
    """A public Redis is reported, and the message never contains the URL's password."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={},
        redis_url="rediss://user:hunter2@8.8.8.8:6380/0",
    )
    assert [(f.code, f.subject) for f in findings] == [("upstream_public", "redis.url")]
    assert "hunter2" not in findings[0].message


def test_redis_unix_socket_is_fine() -> None:
    """A unix-socket Redis has no network exposure."""
    findings = check_exposure(
        bind_host="::1", tls_in_front=False, backends={}, redis_url="unix:///run/redis.sock"
    )
    assert findings == []


def test_link_local_backend_warns() -> None:
    """A link-local replica (e.g. the metadata address) is flagged as unusual."""
    findings = check_exposure(
        bind_host="127.0.0.1", tls_in_front=False, backends={"fast": ["http://169.254.169.254"]}
    )
    assert [(f.code, f.severity) for f in findings] == [
        ("upstream_unusual_address", Severity.WARNING)
    ]


@pytest.mark.parametrize(
    ("bind_host", "code"),
    [("0.0.0.0", "bind_all_interfaces"), ("::", "bind_all_interfaces"), ("8.8.8.8", "bind_public")],
)
def test_public_listener_without_tls_is_an_error(bind_host: str, code: str) -> None:
    """Listening on every interface or a public address without TLS in front is an error."""
    findings = check_exposure(bind_host=bind_host, tls_in_front=False, backends={})
    assert [(f.code, f.severity, f.subject) for f in findings] == [
        (code, Severity.ERROR, "server.host")
    ]


def test_tls_in_front_clears_the_listener_finding() -> None:
    """With a TLS terminator declared in front, a wildcard bind is accepted."""
    assert check_exposure(bind_host="0.0.0.0", tls_in_front=True, backends={}) == []


def test_private_listener_is_fine() -> None:
    """Binding a private address (a pod IP, a LAN address) is not public exposure."""
    assert check_exposure(bind_host="10.244.1.7", tls_in_front=False, backends={}) == []


def test_listener_name_resolving_publicly_is_an_error() -> None:
    """A listen host name is resolved; a public result is an error."""
    resolve = _table({"edge.example.com": ["8.8.8.8"]})
    findings = check_exposure(
        bind_host="edge.example.com", tls_in_front=False, backends={}, resolve=resolve
    )
    assert [f.code for f in findings] == ["bind_public"]


def test_bad_url_is_an_error() -> None:
    """A replica URL without a host cannot be checked and is an error."""
    findings = check_exposure(
        bind_host="127.0.0.1", tls_in_front=False, backends={"f": ["http://"]}
    )
    assert [(f.code, f.severity) for f in findings] == [("upstream_bad_url", Severity.ERROR)]


@pytest.mark.parametrize(
    ("mode", "severity", "refused"),
    [
        ("strict", Severity.ERROR, True),
        ("strict", Severity.WARNING, False),
        ("warn", Severity.ERROR, False),
        ("off", Severity.ERROR, False),
    ],
)
def test_refuses_start_only_in_strict_mode_on_errors(
    mode: str, severity: Severity, refused: bool
) -> None:
    """Only strict mode with at least one error finding refuses to start."""
    findings = [Finding("x", severity, "server.host", "m")]
    assert refuses_start(findings, mode) is refused
    assert not refuses_start([], mode)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("8\u30028\u30028\u30028", HostClass.PUBLIC),  # ideographic full stops
        ("\uff18\uff0e\uff18\uff0e\uff18\uff0e\uff18", HostClass.PUBLIC),  # fullwidth
        ("\uff11\uff13\uff14\uff17\uff14\uff14\uff10\uff17\uff12", HostClass.PUBLIC),
        ("0\u30020\u30020\u30020", HostClass.ALL_INTERFACES),
        ("\uff11\uff12\uff17\u3002\uff10\u3002\uff10\u3002\uff11", HostClass.LOOPBACK),
    ],
)
def test_unicode_spellings_are_classified_as_what_the_socket_layer_connects_to(
    host: str, expected: HostClass
) -> None:
    """getaddrinfo IDNA-folds these to the ASCII address (8。8。8。8 connects to 8.8.8.8):
    they were taken for single-label private names, and 0。0。0。0 bound every interface."""
    assert classify_host(host) is expected
