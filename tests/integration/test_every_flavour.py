"""The same gateway scenarios against every simulator flavour, on the default config.

A backend difference the gateway does not absorb (health, stream usage, request ids, error
bodies) shows up here as a failing case for that flavour.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

FLAVOURS = ("vllm", "sglang", "llamacpp", "llamacpp-python", "ollama", "tgi")
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


class Stack:
    """Two simulators of one flavour and a gateway before them, started on first use."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[SimulatorProcess, SimulatorProcess, GatewayProcess]] = {}

    def __call__(self, flavor: str) -> GatewayProcess:
        if flavor not in self.running:
            sims = [
                SimulatorProcess(
                    "--flavor",
                    flavor,
                    "--profile",
                    profile,
                    "--latency-scale",
                    "0",
                    "--health-delay",
                    "0",
                ).start()
                for profile in ("fast", "precise")
            ]
            config = {
                "auth": {"enabled": False},
                "tiers": tiers_config([sims[0].url], [sims[1].url]),
            }
            gateway = GatewayProcess(config).start()
            self.running[flavor] = (sims[0], sims[1], gateway)
            _wait_ready(gateway)
        return self.running[flavor][2]

    def stop(self) -> None:
        """Stop every process started."""
        for fast, precise, gateway in self.running.values():
            gateway.stop()
            fast.stop()
            precise.stop()


def _wait_ready(gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + patience(20.0)
    while time.monotonic() < deadline:
        if httpx.get(gateway.url + "/readyz").status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"gateway never ready:\n{gateway.log_text()}")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Gateways by flavour."""
    stacks = Stack()
    yield stacks
    stacks.stop()


def _client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=20)


@pytest.mark.parametrize("flavor", FLAVOURS)
def test_unary_answer_with_usage_and_the_callers_id(stack: Stack, flavor: str) -> None:
    """A non-streaming chat answers 200 from the tier asked, with usage and the caller's id."""
    raw = _client(stack(flavor)).chat.completions.with_raw_response.create(
        model="fast",
        messages=MESSAGES,
        max_tokens=4,
        extra_headers={"x-request-id": "caller-chosen-id-1"},
    )
    assert raw.headers["x-tiergate-tier"] == "fast"
    assert raw.headers["x-request-id"] == "caller-chosen-id-1"
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens >= 1


@pytest.mark.parametrize("flavor", FLAVOURS)
def test_stream_with_usage_asked(stack: Stack, flavor: str) -> None:
    """A stream that asked for usage ends with a usage chunk, counted if the server sent none."""
    chunks = list(
        _client(stack(flavor)).chat.completions.create(
            model="fast",
            messages=MESSAGES,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-request-id": str(uuid.uuid4())},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= 1


@pytest.mark.parametrize("flavor", FLAVOURS)
def test_stream_without_usage_ends_with_done_and_no_usage(stack: Stack, flavor: str) -> None:
    """A stream that did not ask for usage gets none, and ends with [DONE]."""
    gateway = stack(flavor)
    body = {"model": "fast", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    text = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=20).text
    events = [e for e in text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert not any('"usage"' in e for e in events)


@pytest.mark.parametrize("flavor", FLAVOURS)
def test_a_refused_request_keeps_the_servers_message(stack: Stack, flavor: str) -> None:
    """The server's 4xx (400, TGI's 422) reaches the caller OpenAI-shaped with its message."""
    answer = httpx.post(
        stack(flavor).url + "/v1/chat/completions",
        timeout=20,
        json={"model": "fast", "n": 2, "messages": MESSAGES},
    )
    assert answer.status_code == (422 if flavor == "tgi" else 400)
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] == "The simulator only supports n=1."
