"""Error bodies and logs must not reflect unbounded caller input."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.gateway_proc import GatewayProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    """A gateway (access log on, the default) in front of one simulator."""

    def access_log_on(config: dict[str, Any], _backends: Backends) -> None:
        del config["telemetry"]

    with running_stack(sims=[FAST_SIM], configure=access_log_on) as stack:
        yield stack.gateway


def test_a_huge_unknown_field_name_is_not_echoed_back_in_full(gateway: GatewayProcess) -> None:
    """A 500 kB field name gives a small 400, not a 1 MB body (it is echoed twice today)."""
    name = "x" * 500_000
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "fast", "messages": CHAT, "max_tokens": 2, name: 1},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_parameter"
    assert len(resp.content) < 4096, f"{len(resp.content)} bytes of error body"


def test_a_huge_model_name_does_not_flood_the_log(gateway: GatewayProcess) -> None:
    """Ten 404s for a 100 kB model name add far less than 1 MB of log (all of it today)."""
    before = len(gateway.log_text())
    for _ in range(10):
        resp = httpx.post(
            gateway.url + "/v1/chat/completions",
            timeout=10,
            json={"model": "m" * 100_000, "messages": CHAT},
        )
        assert resp.status_code == 404
        assert len(resp.content) < 4096
    time.sleep(1.0)
    grown = len(gateway.log_text()) - before
    assert grown < 100_000, f"the log grew by {grown} bytes for 10 refused requests"
