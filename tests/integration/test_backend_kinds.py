"""A gateway on defaults in front of non-vLLM servers, and error bodies that name the truth.

The servers are simulator processes in llama-cpp-python's flavour (no /health, no usage in
streams, UUID-only request ids) and SGLang's (slow /health, flat error bodies).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.adversarial.test_memory import rss_mib
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-kinds-tests"


def _sim(flavor: str, profile: str) -> SimulatorProcess:
    return SimulatorProcess(
        "--flavor", flavor, "--profile", profile, "--latency-scale", "0", "--health-delay", "0"
    )


@pytest.fixture(scope="module")
def llama_sims() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    """Two llama-cpp-python-flavoured servers: the fast and the precise tier."""
    with _sim("llamacpp-python", "fast") as fast, _sim("llamacpp-python", "precise") as precise:
        yield fast, precise


def _wait_ready(gw: GatewayProcess, timeout: float | None = None) -> dict[str, Any]:
    """/readyz's answer once it is 200, or after ``timeout`` (default: a stretched 20 s)."""
    deadline = time.monotonic() + (patience(20.0) if timeout is None else timeout)
    while True:
        answer = httpx.get(gw.url + "/readyz")
        if answer.status_code == 200 or time.monotonic() > deadline:
            result: dict[str, Any] = answer.json()
            return result
        time.sleep(0.1)


def _config(fast: SimulatorProcess, precise: SimulatorProcess, **tier: Any) -> dict[str, Any]:
    return {
        "auth": {"enabled": False, "admin_token": ADMIN},
        "tiers": tiers_config([fast.url], [precise.url], **tier),
    }


@pytest.fixture(scope="module")
def gateway(llama_sims: tuple[SimulatorProcess, SimulatorProcess]) -> Iterator[GatewayProcess]:
    """A gateway on the default config (kind auto, no health_path) before both servers."""
    with GatewayProcess(_config(*llama_sims)) as gw:
        yield gw


def test_defaults_serve_a_llama_cpp_python_server(gateway: GatewayProcess) -> None:
    """Without /health the tiers are still ready, and `model: fast` is answered by fast."""
    assert _wait_ready(gateway)["status"] == "ready"
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_headers={"x-request-id": "not-a-uuid-at-all"},
    )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-tiergate-tier"] == "fast"
    assert raw.headers["x-request-id"] == "not-a-uuid-at-all"


def test_stream_usage_is_counted_when_the_server_sends_none(gateway: GatewayProcess) -> None:
    """llama-cpp-python sends no usage chunk; the caller who asked still gets one."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="fast",
            messages=[{"role": "user", "content": "count"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    # One token per chunk with content (the simulator's final chunk carries the last one).
    tokens = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert usage.completion_tokens == tokens >= 1


def test_admin_view_shows_what_was_detected(gateway: GatewayProcess) -> None:
    """/admin/backends says each replica's configured and detected kind, and why."""
    _wait_ready(gateway)
    view = httpx.get(
        gateway.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"}
    ).json()
    backend = view["tiers"]["fast"]["replicas"][0]["backend"]
    assert backend["configured"] == "auto"
    assert backend["kind"] == "llamacpp"
    assert backend["probe_path"] == "/docs"
    assert backend["stream_usage"] is False
    # Named by its OpenAPI title: the model list, which waits behind a generation there, is
    # not asked at all (issue 24).
    assert backend["detection"] == "/openapi.json titled llama.cpp"
    assert "backend.detected" in gateway.log_text()


def test_unavailable_names_the_tier_asked_the_fallback_and_each_reason(
    llama_sims: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """Forcing /health on a server without it: the 503 names fast (asked), precise
    (fallback) and each replica's health answer (by tier and place, not address), not only the
    last tier tried."""
    fast, precise = llama_sims
    with GatewayProcess(_config(fast, precise, health_path="/health")) as gw:
        assert _wait_ready(gw, timeout=3)["status"] == "not_ready"
        answer = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "fast", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "no_healthy_replica"
    message = error["message"]
    asked, _, fallback = message.partition("tier 'precise' (fallback)")
    assert message.startswith(
        "No tier could serve the request. tier 'fast' (asked): no healthy replica: replica "
    )
    # A replica is named by its tier and place in the tier's list, never by its address
    # (the caller has no business knowing the inference network's addresses and ports).
    assert "replica fast#1 unhealthy (health check: /health answered 404)" in asked
    assert "replica precise#1 unhealthy" in fallback
    assert "127.0.0.1" not in message
    assert str(fast.port) not in message
    assert str(precise.port) not in message
    assert set(error) == {"message", "type", "param", "code"}


def test_a_single_tier_failure_names_each_replica_tried() -> None:
    """Upstream 500s on every replica of a tier (no fallback): the 502 lists the replicas by
    tier and place, not address."""
    with _sim("sglang", "fast") as fast, _sim("sglang", "precise") as precise:
        fast.set_faults(fail_500=1.0)
        precise.set_faults(fail_500=1.0)
        config = _config(fast, precise)
        config["router"] = {"fallback_to_precise": False}
        with GatewayProcess(config) as gw:
            _wait_ready(gw)
            answer = httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "fast", "messages": [{"role": "user", "content": "hi"}]},
            )
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert "The 'fast' tier could not serve the request" in message
    assert "replica fast#1: Simulated 500 error" in message
    assert "127.0.0.1" not in message
    assert str(fast.port) not in message


def test_tgi_validation_errors_pass_through_with_their_message() -> None:
    """TGI's 422 {"error": "...", "error_type"} reaches the caller as an OpenAI-shaped 422."""
    fast, precise = _sim("tgi", "fast"), _sim("tgi", "precise")
    with fast, precise, GatewayProcess(_config(fast, precise)) as gw:
        _wait_ready(gw)
        answer = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "fast", "n": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["message"] == "The simulator only supports n=1."
    assert set(error) == {"message", "type", "param", "code"}


def test_failing_over_big_bodies_keeps_no_memory(
    llama_sims: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """~100 MB of 3 MB requests failing on both tiers: the summed-up 503s keep nothing."""
    fast, precise = llama_sims
    config = _config(fast, precise, health_path="/health")
    config["server"] = {"max_body_bytes": 4 * 1024 * 1024}
    big = "x " * 1_500_000
    body = json.dumps({"model": "fast", "messages": [{"role": "user", "content": big}]})
    with GatewayProcess(config) as gw:
        _wait_ready(gw, timeout=3)
        with httpx.Client(timeout=30) as client:

            def send(times: int) -> None:
                for _ in range(times):
                    answer = client.post(
                        gw.url + "/v1/chat/completions",
                        content=body,
                        headers={"Content-Type": "application/json"},
                    )
                    assert answer.status_code == 503

            send(4)  # warm-up
            before = rss_mib(gw.pid)
            send(32)
            after = rss_mib(gw.pid)
    assert after - before < 40, f"RSS grew {after - before:.0f} MiB"
