"""What a traced answer's span holds with ``telemetry.capture_content`` on: tool calls and
thinking as well as text.

A real ``tiergate serve`` (auth off, tracing to an OTLP receiver in this process) in front of
the scripted backend of the billing attacks (``tests.adversarial.bill_upstream``), which
answers as vLLM does with ``--reasoning-parser`` and ``--tool-call-parser hermes``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.adversarial.bill_upstream import CALL
from tests.adversarial.telemetry_stack import Received, traced_gateway
from tests.adversarial.test_attack_bill import chat
from tests.adversarial.test_attack_telemetry import _value, _wait_spans
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.slow  # real processes: make test-all and CI

Traced = tuple[GatewayProcess, Received]


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    """The scripted backend behind both tiers and a gateway tracing every request with
    content capture on; the OTLP receiver's list of export requests."""
    with traced_gateway("bill_upstream", tier={"kind": "vllm"}) as stack:
        yield stack


def _output(traced: Traced, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST ``body``; the client span's ``gen_ai.output.messages``, decoded."""
    gateway, received = traced
    received.clear()
    response = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 200
    spans = _wait_spans(received, 2)
    (client,) = [span for span in spans if span.name.startswith("chat ")]
    attributes = {a.key: _value(a) for a in client.attributes}
    messages: list[dict[str, Any]] = json.loads(attributes["gen_ai.output.messages"])
    return messages


TOOL_CALL = {"type": "tool_call", "id": "chatcmpl-tool-0", **CALL}


@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_call_is_in_the_traced_output(traced: Traced, stream: bool) -> None:
    """A tool call (no ``content``), streamed in pieces or whole: the span's output message
    holds its id, name and whole arguments, and its finish reason, not an empty text."""
    scenario = "stream_tool_call" if stream else "whole_tool_call"
    (message,) = _output(traced, chat(scenario, stream=stream))
    assert message["parts"] == [TOOL_CALL]
    assert message["finish_reason"] == "tool_calls"


def test_thinking_is_in_the_traced_output(traced: Traced) -> None:
    """A reasoning model's stream: its thinking (``reasoning_content``) is a reasoning part
    before the answer's text."""
    (message,) = _output(traced, chat("stream_reasoning_answer", stream=True))
    assert message["parts"] == [
        {"type": "reasoning", "content": "tttt"},
        {"type": "text", "content": "Yes."},
    ]
    assert message["finish_reason"] == "stop"
