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

from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience
from tests.stack import running_stack

pytestmark = pytest.mark.slow  # a process fleet: make test-all and CI

FLAVOURS = ("vllm", "sglang", "llamacpp", "llamacpp-python", "ollama", "tgi")
INSTANT = ("--latency-scale", "0", "--health-delay", "0")
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module", params=FLAVOURS)
def flavor(request: pytest.FixtureRequest) -> str:
    """Each flavour in turn: pytest runs every test of one flavour before the next, so one
    flavour's processes run at a time, and a worker that takes some of this module's tests
    starts only their flavours."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def gateway(flavor: str) -> Iterator[GatewayProcess]:
    """Two simulators of the flavour (fast, precise) and a gateway before them on the default
    configuration, forked from the pre-imported fork server."""
    sims = [("--flavor", flavor, "--profile", profile, *INSTANT) for profile in ("fast", "precise")]
    with running_stack(sims=sims, gateway_type=ForkedGateway) as stack:
        _wait_ready(stack.gateway)
        yield stack.gateway


def _wait_ready(gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + patience(20.0)
    while time.monotonic() < deadline:
        if httpx.get(gateway.url + "/readyz").status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"gateway never ready:\n{gateway.log_text()}")


def _client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=20)


def test_unary_answer_with_usage_and_the_callers_id(gateway: GatewayProcess) -> None:
    """A non-streaming chat answers 200 from the tier asked, with usage and the caller's id."""
    raw = _client(gateway).chat.completions.with_raw_response.create(
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


def test_stream_with_usage_asked(gateway: GatewayProcess) -> None:
    """A stream that asked for usage ends with a usage chunk, counted if the server sent none."""
    chunks = list(
        _client(gateway).chat.completions.create(
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


def test_stream_without_usage_ends_with_done_and_no_usage(gateway: GatewayProcess) -> None:
    """A stream that did not ask for usage gets none, and ends with [DONE]."""
    body = {"model": "fast", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    text = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=20).text
    events = [e for e in text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert not any('"usage"' in e for e in events)


def test_a_refused_request_keeps_the_servers_message(gateway: GatewayProcess, flavor: str) -> None:
    """The server's 4xx (400, TGI's 422) reaches the caller OpenAI-shaped with its message."""
    answer = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=20,
        json={"model": "fast", "n": 2, "messages": MESSAGES},
    )
    assert answer.status_code == (422 if flavor == "tgi" else 400)
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] == "The simulator only supports n=1."
