"""Attacks on shadow evaluation: the shadow resends a body checked for one tier to the other."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
PUBLIC = "http://93.184.215.14/cat.png"
FAST_CAP = 32


class Stack:
    """A fast and a precise simulator behind a gateway that shadows every request."""

    def __init__(
        self, gateway: GatewayProcess, fast: SimulatorProcess, precise: SimulatorProcess
    ) -> None:
        self.gateway, self.fast, self.precise = gateway, fast, precise

    def post(self, body: dict[str, Any]) -> httpx.Response:
        """POST a chat body."""
        return httpx.post(self.gateway.url + "/v1/chat/completions", json=body, timeout=10)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Fast allows remote media and caps max_tokens at 32; precise is inline only, cap 4096."""
    with (
        SimulatorProcess(
            "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
        ) as fast,
        SimulatorProcess(
            "--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0"
        ) as precise,
    ):
        tiers = tiers_config([fast.url], [precise.url])
        tiers["fast"]["allow_remote_media"] = True
        tiers["fast"]["max_tokens_cap"] = FAST_CAP
        config = {
            "auth": {"enabled": False},
            "tiers": tiers,
            "router": {"shadow": {"fast_ratio": 1.0, "precise_ratio": 1.0, "max_waiting": 1000}},
            "telemetry": {"access_log": False},
        }
        with GatewayProcess(config) as gateway:
            yield Stack(gateway, fast, precise)


def wait_for_request(sim: SimulatorProcess, before: int) -> dict[str, Any]:
    """The body of the next request ``sim`` receives after ``before`` (the shadow's)."""
    deadline = time.monotonic() + patience(5)
    while time.monotonic() < deadline:
        stats = sim.stats()
        if stats["requests_total"] > before:
            return dict(stats["last_request"])
        time.sleep(0.05)
    return {}


def test_a_shadow_does_not_send_remote_media_to_a_tier_that_forbids_it(stack: Stack) -> None:
    """A URL allowed on fast must not reach precise (inline media only) through the shadow."""
    before = stack.precise.stats()["requests_total"]
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": PUBLIC}},
    ]
    resp = stack.post(
        {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}
    )
    assert resp.status_code == 200, resp.text
    seen = wait_for_request(stack.precise, before)
    assert PUBLIC not in str(seen), "the shadow handed precise a URL it forbids"


def test_a_shadow_respects_the_target_tier_max_tokens_cap(stack: Stack) -> None:
    """A precise request with max_tokens 2000 is shadowed on fast (cap 32) above its cap."""
    before = stack.fast.stats()["requests_total"]
    resp = stack.post(
        {
            "model": "precise",
            "max_tokens": 2000,
            "messages": [{"role": "user", "content": "write a long story"}],
        }
    )
    assert resp.status_code == 200, resp.text
    seen = wait_for_request(stack.fast, before)
    assert seen, "no shadow reached fast"
    asked = max(int(seen.get("max_tokens") or 0), int(seen.get("max_completion_tokens") or 0))
    assert asked <= FAST_CAP, f"the shadow asked fast for {asked} tokens (cap {FAST_CAP})"


def test_a_shadow_never_sends_a_prompt_to_a_tier_the_key_may_not_use(
    tmp_path: Path,
) -> None:
    """A fast-only key's prompts stay off precise: allowed_tiers binds shadows too."""
    path = tmp_path / "keys.yaml"
    record, key = issue_key("t", KeyPolicy(allowed_tiers=frozenset({"fast"})), now=time.time())
    FileKeyStore(path).put_sync(record)
    with (
        SimulatorProcess(
            "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
        ) as fast,
        SimulatorProcess(
            "--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0"
        ) as precise,
    ):
        config = {
            "auth": {"keys_file": str(path)},
            "tiers": tiers_config([fast.url], [precise.url]),
            "router": {"shadow": {"fast_ratio": 1.0, "max_waiting": 1000}},
            "telemetry": {"access_log": False},
        }
        with GatewayProcess(config) as gateway:
            body = {
                "model": "fast",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "confidential: fast tier only"}],
            }
            resp = httpx.post(
                gateway.url + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            )
            assert resp.status_code == 200, resp.text
            seen = wait_for_request(precise, 0)
    assert not seen, "a fast-only key's prompt was sent to precise by a shadow"
