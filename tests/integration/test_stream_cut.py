"""A stream cut short is an error, never a success (issue 24), against one-at-a-time servers.

The servers are simulator processes as llama-cpp-python's server runs by default
(``--flavor llamacpp-python --serial interrupt``): one generation at a time, ``/v1/models``
waiting behind it, and a running stream ended with ``[DONE]`` and no ``finish_reason`` as soon
as another request waits. The gateway used to probe ``/v1/models`` there, cutting the caller's
answer short and reporting it complete. Each case streams three answers through the official
client and checks every one arrived whole; the last case cuts a stream from outside and checks
the caller sees an error, and the gateway counts it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.gateway_proc import GatewayProcess
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow  # a process fleet: make test-all and CI

ADMIN = "admin-token-for-stream-cut-tests"
TOKENS = 24
PROMPT = "Write a Python function that reverses a list."


def _sim(profile: str, model: str) -> SimulatorProcess:
    # --latency-scale 4: a 24-token answer takes about 1 s, so probes land mid-stream.
    return SimulatorProcess(
        "--flavor",
        "llamacpp-python",
        "--serial",
        "interrupt",
        "--profile",
        profile,
        "--model",
        model,
        "--latency-scale",
        "4",
        "--jitter",
        "0",
    )


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    """Two one-at-a-time servers that interrupt a stream when a request waits."""
    with _sim("fast", "smollm2-fast") as fast, _sim("precise", "smollm2-precise") as precise:
        yield fast, precise


def _config(servers: tuple[SimulatorProcess, SimulatorProcess], **tier: Any) -> dict[str, Any]:
    fast, precise = servers
    return {
        "auth": {"enabled": False, "admin_token": ADMIN},
        "tiers": {
            "fast": {"model": "smollm2-fast", "replicas": [fast.url], **tier},
            "precise": {"model": "smollm2-precise", "replicas": [precise.url], **tier},
        },
    }


def _stream(gw: GatewayProcess) -> tuple[str, int, str | None]:
    """One streamed answer: its text, the usage's completion tokens, the finish reason."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    text, completion, finish = [], -1, None
    for chunk in client.chat.completions.create(
        model="precise",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": TOKENS},  # the simulator then always writes 24 tokens
    ):
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), completion, finish


def _three_whole_streams(gw: GatewayProcess) -> None:
    for _ in range(3):
        text, completion, finish = _stream(gw)
        assert (completion, finish) == (TOKENS, "length"), text
        assert text


def test_a_models_health_path_never_cuts_a_stream(
    servers: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """health_path /v1/models on both tiers: every stream arrives whole (24 tokens)."""
    with GatewayProcess(_config(servers, health_path="/v1/models")) as gw:
        gw.wait_until_ready()
        _three_whole_streams(gw)


def test_streams_after_a_non_streamed_request_arrive_whole(
    servers: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """The same, right after one non-streamed model=auto request (it used to leave 0 tokens)."""
    with GatewayProcess(_config(servers, health_path="/v1/models")) as gw:
        gw.wait_until_ready()
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=TOKENS,
            extra_body={"min_tokens": TOKENS},
        )
        assert answer.choices[0].finish_reason == "length"
        _three_whole_streams(gw)


def test_a_second_gateway_starting_beside_never_cuts_a_stream(
    servers: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """Auto-detected kind; a second gateway detects the same servers while streams run."""
    with GatewayProcess(_config(servers)) as gw:
        gw.wait_until_ready()
        results: list[tuple[str, int, str | None]] = []
        worker = threading.Thread(target=lambda: results.extend(_stream(gw) for _ in range(3)))
        worker.start()
        with GatewayProcess(_config(servers)) as second:
            second.wait_until_ready()
            worker.join(timeout=60)
            detected = httpx.get(
                second.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"}
            ).json()
        assert [(c, f) for _, c, f in results] == [(TOKENS, "length")] * 3
        backend = detected["tiers"]["precise"]["replicas"][0]["backend"]
        assert (backend["kind"], backend["probe_path"]) == ("llamacpp", "/docs")


def test_two_callers_at_once_with_max_concurrency_1_both_get_whole_answers(
    servers: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """Two callers at once on one llama-cpp-python server: with ``max_concurrency: 1`` the
    second waits in the gateway, not at the server (where it would cut the first stream)."""
    config = _config(servers, max_concurrency=1, max_queue_wait_s=30)
    with GatewayProcess(config) as gw:
        gw.wait_until_ready()
        results: list[tuple[str, int, str | None]] = []
        first = threading.Thread(target=lambda: results.append(_stream(gw)))
        first.start()
        time.sleep(0.3)  # the first stream is generating
        results.append(_stream(gw))
        first.join(timeout=60)
        assert [(c, f) for _, c, f in results] == [(TOKENS, "length")] * 2


def _interrupt_soon(server: SimulatorProcess) -> None:
    """Another client asks the server's model list while the gateway's stream runs."""
    time.sleep(0.3)
    httpx.get(server.url + "/v1/models", timeout=30)


def test_a_stream_the_server_cuts_is_an_error_for_the_caller_and_counted(
    servers: tuple[SimulatorProcess, SimulatorProcess],
) -> None:
    """[DONE] without a finish_reason: the openai client raises, the access log says
    upstream_truncated, and the truncation metric and /admin/backends count it."""
    with GatewayProcess(_config(servers)) as gw:
        gw.wait_until_ready()
        poke = threading.Thread(target=_interrupt_soon, args=(servers[1],))
        poke.start()
        with pytest.raises(openai.APIError, match="before the answer was finished"):
            _stream(gw)
        poke.join()
        admin = {"Authorization": f"Bearer {ADMIN}"}
        metrics = httpx.get(gw.url + "/metrics", headers=admin).text
        assert (
            'tiergate_stream_truncated_total{cause="no_finish_reason",tier="precise"} 1.0'
            in metrics
        )
        view = httpx.get(gw.url + "/admin/backends", headers=admin).json()
        replica = view["tiers"]["precise"]["replicas"][0]
        assert replica["truncated_streams"] == {"no_finish_reason": 1}
        deadline = time.monotonic() + 5
        while not (access := gw.access_lines()):
            assert time.monotonic() < deadline, gw.log_text()
            time.sleep(0.05)
        assert [(a["status"], a["outcome"], a["stream_cut"]) for a in access] == [
            (200, "upstream_truncated", "no_finish_reason")
        ]
