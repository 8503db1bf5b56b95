"""The vLLM surface through a real gateway (issue 36 item 4): the context pre-check, a sleeping
engine, upstream keys that rotate, and vLLM's open routes never forwarded.

Every backend is a simulator process; every client call goes through the official ``openai``
client or plain HTTP to a real ``tiergate serve``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import openai
import pytest

from policies.vllm_surface import OPEN_ROUTES
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess
from tests.stack import Backends, Configure, Stack, running_stack

pytestmark = pytest.mark.slow  # gateway and simulator fleets: make test-all

ADMIN = "admin-token-for-vllm-surface"
FAST_CONTEXT = 512
PRECISE_CONTEXT = 4096


def _sim(profile: str, *extra: str) -> tuple[str, ...]:
    return ("--profile", profile, "--model", f"tiergate-{profile}", "--latency-scale", "0", *extra)


def _surface(**tier: Any) -> Configure:
    """Admin token, fast health checks, and ``tier`` settings on both tiers."""

    def configure(config: dict[str, Any], backends: Backends) -> None:
        config["auth"]["admin_token"] = ADMIN
        config["health"] = {"interval_s": 0.1}
        del config["telemetry"]  # the default access log: its lines are checked for keys too
        config["tiers"] = tiers_config([backends.fast.url], [backends.precise.url], **tier)

    return configure


def _backends(gw: GatewayProcess) -> dict[str, Any]:
    answer = httpx.get(gw.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    return result


def _replica(gw: GatewayProcess, tier: str) -> dict[str, Any]:
    tiers = _backends(gw)["tiers"]
    found: dict[str, Any] = tiers[tier]["replicas"][0]
    return found


def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """A fast tier with a 512-token context (dev mode: sleep routes) and a 4096 precise tier,
    behind a gateway that has read both tiers' contexts from their model cards."""
    fast = _sim("fast", "--max-model-len", str(FAST_CONTEXT), "--dev-mode")
    precise = _sim("precise", "--max-model-len", str(PRECISE_CONTEXT))
    with running_stack(sims=(fast, precise), configure=_surface(max_tokens_cap=8192)) as stack:
        gw = stack.gateway
        _until(lambda: _backends(gw)["tiers"]["precise"]["max_model_len"] == PRECISE_CONTEXT)
        _until(lambda: _backends(gw)["tiers"]["fast"]["max_model_len"] == FAST_CONTEXT)
        assert _replica(gw, "fast")["backend"]["max_model_len"] == FAST_CONTEXT
        yield stack


@pytest.fixture(scope="module")
def sims(stack: Stack) -> tuple[SimulatorProcess, SimulatorProcess]:
    """The fast and the precise simulator."""
    return stack.fast, stack.precise


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> GatewayProcess:
    """The gateway in front of them."""
    return stack.gateway


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)


def test_too_long_for_every_tier_is_refused_before_any_backend(
    gateway: GatewayProcess, sims: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    """max_tokens beyond every tier's context: 400 context_length_exceeded, no backend asked."""
    before = [sim.stats()["requests_total"] for sim in sims]
    with pytest.raises(openai.BadRequestError) as info:
        _client(gateway).chat.completions.create(
            model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=5000
        )
    assert info.value.code == "context_length_exceeded"
    assert info.value.param == "messages"
    assert "maximum context length is 4096 tokens" in info.value.message
    with pytest.raises(openai.BadRequestError) as prompt_only:
        _client(gateway).completions.create(model="precise", prompt="word " * 8000)
    assert prompt_only.value.code == "context_length_exceeded"
    assert prompt_only.value.param == "prompt"
    assert [sim.stats()["requests_total"] for sim in sims] == before


def test_a_request_too_long_for_its_tier_goes_to_the_next_that_fits(
    gateway: GatewayProcess, sims: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    """1000 tokens asked of the 512-token fast tier: served by precise, reported as a fallback."""
    raw = _client(gateway).chat.completions.with_raw_response.create(
        model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=1000
    )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-tiergate-tier"] == "precise"
    assert raw.headers["x-tiergate-fallback-from"] == "fast"
    assert raw.headers["x-tiergate-fallback-reason"] == "context_length_exceeded"
    assert sims[1].stats()["last_request"]["max_tokens"] == 1000


def test_near_the_edge_the_backend_decides(
    gateway: GatewayProcess, sims: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    """A prompt whose estimate overflows but whose lower bound fits goes to the backend."""
    fast = sims[0]
    before = fast.stats()["requests_total"]
    prompt = "abcd " * 320  # 1,600 characters: estimate 401 tokens, lower bound 200
    with pytest.raises(openai.BadRequestError) as info:
        _client(gateway).chat.completions.create(
            model="fast",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=200,
        )
    assert fast.stats()["requests_total"] == before + 1  # the simulator's own 400:
    assert "your request has 3" in info.value.message  # 320 words and the chat template


def test_a_missing_max_tokens_is_capped_to_what_fits(
    gateway: GatewayProcess, sims: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    """No max_tokens on the 512-token tier: the forwarded body asks 512 minus the estimate."""
    prompt = "x" * 400  # estimate: (400 + 5 template tokens * 4) // 4 + 1 = 106 tokens
    answer = _client(gateway).chat.completions.create(
        model="fast",
        messages=[{"role": "user", "content": prompt}],
        extra_headers={"x-tiergate-tier": "fast"},
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert sims[0].stats()["last_request"]["max_tokens"] == FAST_CONTEXT - 106


def test_a_sleeping_engine_is_unready_although_its_health_says_200(
    gateway: GatewayProcess, sims: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    """vLLM's POST /sleep: /health stays 200, the gauge says asleep, the replica leaves rotation."""
    fast = sims[0]
    assert httpx.post(fast.url + "/sleep", params={"level": "1"}).status_code == 200
    try:
        assert httpx.get(fast.url + "/health").status_code == 200
        _until(lambda: httpx.get(gateway.url + "/readyz").status_code == 503)
        assert httpx.get(gateway.url + "/readyz").json()["tiers"]["fast"] is False
        replica = _replica(gateway, "fast")
        assert replica["backend"]["sleep_state"] == "weights_offloaded"
        assert replica["state"] == "unhealthy"
        assert "engine asleep" in replica["recent_errors"][0]["message"]
        raw = _client(gateway).chat.completions.with_raw_response.create(
            model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert raw.headers["x-tiergate-tier"] == "precise"  # the fallback, not a 503
    finally:
        assert httpx.post(fast.url + "/wake_up").status_code == 200
    _until(lambda: httpx.get(gateway.url + "/readyz").status_code == 200)
    assert _replica(gateway, "fast")["backend"]["sleep_state"] == "awake"


def test_vllm_open_routes_are_never_forwarded(gateway: GatewayProcess) -> None:
    """Every route of vLLM's open table answers 404/405 at the gateway, whatever the method."""
    for route in OPEN_ROUTES:
        for method in ("GET", "POST"):
            answer = httpx.request(method, gateway.url + route.path, json={})
            assert answer.status_code in (404, 405), route.path
            assert "error" in answer.json()


def _keyed_stack(accepted: str, keys: list[str]) -> AbstractContextManager[Stack]:
    """One simulator taking only ``accepted``, behind both tiers with upstream keys ``keys``."""
    return running_stack(
        sims=(_sim("fast", "--api-key", accepted),), configure=_surface(api_key=keys)
    )


def test_upstream_keys_rotate_to_the_one_the_backend_takes() -> None:
    """Keys [old, new] before a backend that only takes new: 200, never misconfigured."""
    keys = ["old-key-value", "new-key"]
    with _keyed_stack("new-key", keys) as stack:
        gw = stack.gateway
        for _ in range(3):
            answer = _client(gw).chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert answer.choices[0].message.content is not None
        assert _replica(gw, "fast")["misconfigured"] is False
        log = gw.log_text()
        assert "replica.misconfigured" not in log
        assert "replica.upstream_key_refused" in log  # once, naming the next key's position
        assert "new-key" not in log
        assert "old-key-value" not in log


def test_every_key_refused_marks_the_replica_misconfigured() -> None:
    """Keys the backend refuses all: 502 upstream_auth_failed and the replica misconfigured."""
    with _keyed_stack("right", ["wrong-1", "wrong-2"]) as stack:
        gw = stack.gateway
        with pytest.raises(openai.APIStatusError) as info:
            _client(gw).chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert info.value.status_code == 502
        assert info.value.code == "upstream_auth_failed"
        assert _replica(gw, "fast")["misconfigured"] is True
