"""Attacks on the HTTP edge (gateway/http/protocol.py, asgi.py) by a hostile or careless client.

Each test here failed before the fix it names (attack review of the own protocol, 2026-12-06).
What held without a fix is listed in the branch's report, not tested twice here: smuggling
shapes (Content-Length with Transfer-Encoding, two Content-Lengths, obs-fold, bare LF, a
chunk size past 64 bits) are refused 400 by llhttp on both paths.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adversarial.rawhttp import closed_within, connect, statuses
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayProcess]:
    """Auth off, in front of a zero-latency simulator."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as sim:
        config = {"auth": {"enabled": False}, "tiers": tiers_config([sim.url], [sim.url])}
        with GatewayProcess(config) as proc:
            yield proc


@pytest.mark.parametrize("path", [b"/no-such-path", b"/v1/models"])
def test_an_answer_before_an_expected_body_closes_the_connection(
    gw: GatewayProcess, path: bytes
) -> None:
    """A Litestar route that answers (404, 405) a request waiting on ``Expect: 100-continue``
    never asked for its body. A client may then skip the body (RFC 9110, 10.1.1) and send its
    next request, which the gateway read as the rest of the old body: the next request was
    lost, unanswered. The answer now closes the connection, as the native path's 413 does."""
    sock = connect(gw.port)
    sock.sendall(
        b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Length: 20\r\n\r\n"
    )
    closed, data = closed_within(sock, 5.0)
    sock.close()
    assert statuses(data) in ([404], [405]), data
    assert b"connection: close" in data.lower(), data
    assert closed, data
