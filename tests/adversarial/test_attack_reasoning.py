"""Reasoning models and tool calls against the bill, the stream contract and the request rules.

Qwen3 or QwQ behind vLLM with ``--reasoning-parser`` and ``--tool-call-parser hermes`` answer in
shapes a plain chat model never sends: chunks whose delta holds only ``reasoning_content``
(older vLLM) or ``reasoning`` (newer), tool calls streamed as ``delta.tool_calls`` pieces with
no ``content`` and ``finish_reason: "tool_calls"``, whole answers with ``content: null``. The
scripted backend (``tests.adversarial.bill_upstream``) answers in each; a real ``tiergate
serve`` keeps keys, limits, budgets and usage in a real redis-server (``billed_gateway``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from policies.requests import validate
from tests.adversarial.bill_upstream import BIG_ARGUMENTS, CALL, PROMPT
from tests.adversarial.test_attack_bill import PRECISE_PER_TOKEN, Bill, billed_gateway, chat, post

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def bill() -> Iterator[Bill]:
    """The billing stack (:func:`billed_gateway`), shared by the module."""
    with billed_gateway() as stack:
        yield stack


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def _outcome(bill: Bill, token: str, body: dict[str, Any]) -> tuple[httpx.Response, str]:
    """POST ``body``; the answer and the access log's outcome."""
    request_id = uuid.uuid4().hex
    response = httpx.post(
        bill.gateway.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {token}", "x-request-id": request_id},
        timeout=10,
    )
    return response, str(bill.gateway.access_of(request_id)["outcome"])


# Billing: thinking and tool calls are generated tokens, charged like an answer's text.


@pytest.mark.parametrize("scenario", ["whole_reasoning_zero", "whole_reasoning_new_zero"])
def test_a_whole_answers_thinking_is_charged_when_usage_says_no_completion(
    bill: Bill, scenario: str
) -> None:
    """A whole answer of 30 rough tokens of thinking and "Yes." (1) reported as
    ``"completion_tokens": 0``: the rough count that stands in for the missing number counts
    the thinking too (31), in the report and the budget, not only the one-token answer."""
    key_id, token = bill.key()
    answer = bill.client(token).chat.completions.create(**chat(scenario))
    assert answer.choices[0].message.content == "Yes."
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (PROMPT, 31)
    assert bill.settled_spend(key_id) == pytest.approx((PROMPT + 31) * PRECISE_PER_TOKEN)


def test_a_whole_tool_call_is_charged_when_usage_says_no_completion(bill: Bill) -> None:
    """A tool call (``content: null``) reported as ``"completion_tokens": 0``: its name (3
    rough tokens) and arguments (9) were generated and are charged, not 0."""
    key_id, token = bill.key()
    answer = bill.client(token).chat.completions.create(**chat("whole_tool_call_zero"))
    calls = answer.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].function.arguments == CALL["arguments"]
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (PROMPT, 12)


@pytest.mark.parametrize(
    "scenario",
    [
        "stream_reasoning_cut",  # vLLM: ``reasoning_content`` only
        "stream_reasoning_role_on_every_chunk_cut",  # Ollama: role and "" content beside
        "stream_reasoning_no_finish_key_cut",  # no ``finish_reason`` key
        "stream_tool_call_cut",  # vLLM's hermes parser: name, then argument pieces
    ],
)
def test_a_stream_cut_mid_thinking_or_mid_call_is_cut_and_charges_what_it_relayed(
    bill: Bill, scenario: str
) -> None:
    """6 chunks of thinking or of a tool call, then the body ends with no final chunk and no
    usage: the caller gets an error event and no ``[DONE]``, the outcome is not
    ``complete``, and the gateway's own count charges the 6 chunks it relayed (a chunk a
    token, as for content), not 0."""
    key_id, token = bill.key()
    response, outcome = _outcome(bill, token, chat(scenario, stream=True))
    assert response.status_code == 200
    assert "data: [DONE]" not in response.text
    assert "error" in _events(response.text)[-1]
    assert outcome == "upstream_reset"  # the connection closed mid-body
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 6


def test_a_cut_stream_charges_a_tool_calls_arguments_sent_in_one_chunk_by_their_size(
    bill: Bill,
) -> None:
    """A tool call whose 2,048 characters of arguments come in one chunk (a parser that
    buffers the whole JSON), then the body ends without usage: the gateway's own count charges
    that chunk by the prompt estimate (512 tokens) and the name's chunk 1, not 2 in all."""
    key_id, token = bill.key()
    body = chat("stream_tool_call_big_arguments_cut", stream=True, max_tokens=1000)
    response, outcome = _outcome(bill, token, body)
    assert outcome == "upstream_reset"
    arguments = _events(response.text)[-2]["choices"][0]["delta"]["tool_calls"][0]["function"]
    assert arguments["arguments"] == BIG_ARGUMENTS
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 1 + 512


def test_a_stream_that_reports_usage_but_never_finishes_is_cut(bill: Bill) -> None:
    """Thinking, then a usage chunk and ``[DONE]`` with no chunk naming a ``finish_reason``:
    cut short (error event, no ``[DONE]``), charged the reported usage."""
    key_id, token = bill.key()
    response, outcome = _outcome(bill, token, chat("stream_reasoning_usage_no_final", stream=True))
    assert "data: [DONE]" not in response.text
    assert outcome == "upstream_truncated"
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (PROMPT, 4)


def test_a_client_that_leaves_mid_thinking_pays_for_the_thinking_it_got(bill: Bill) -> None:
    """The backend thinks for seconds; the client reads 15 thinking chunks and hangs up: the
    gateway charges at least those 15 (and aborts the backend), not the prompt alone."""
    key_id, token = bill.key()
    seen = 0
    with httpx.stream(
        "POST",
        bill.gateway.url + "/v1/chat/completions",
        json=chat("stream_thinking_slowly", stream=True, max_tokens=1000),
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if '"reasoning_content"' in line:
                seen += 1
            if seen == 15:
                break
    deadline = time.monotonic() + 8
    row = bill.usage(key_id)
    while (row is None or row["output_tokens"] < 15) and time.monotonic() < deadline:
        time.sleep(0.1)
        row = bill.usage(key_id)
    assert row is not None
    assert 15 <= row["output_tokens"] < 500


# The stream contract with tool calls and thinking: complete only when finished.


def test_the_openai_client_accumulates_a_streamed_tool_call(bill: Bill) -> None:
    """``client.chat.completions.create(tools=..., stream=True)`` through the gateway: the
    pieces add up to the call the backend made, the last choice chunk says ``tool_calls``,
    the usage chunk the caller asked for comes (20 + 12), the outcome is ``complete``."""
    key_id, token = bill.key()
    stream = bill.client(token).chat.completions.create(
        **chat("stream_tool_call", stream=True, stream_options={"include_usage": True}, tools=TOOLS)
    )
    name, arguments, finish, usage = "", "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                assert call.index == 0
                name += call.function.name or "" if call.function else ""
                arguments += call.function.arguments or "" if call.function else ""
    assert (name, arguments, finish) == (CALL["name"], CALL["arguments"], "tool_calls")
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    assert usage is not None
    assert usage.completion_tokens == 12
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (PROMPT, 12)


def test_a_tool_call_stream_ended_without_done_is_complete(bill: Bill) -> None:
    """The final chunk says ``tool_calls``, then the body ends cleanly without ``[DONE]`` or
    usage: complete (the caller gets the ``[DONE]``), charged the 6 chunks it relayed."""
    key_id, token = bill.key()
    response, outcome = _outcome(bill, token, chat("stream_tool_call_no_done", stream=True))
    assert response.text.rstrip().endswith("data: [DONE]")
    assert outcome == "complete"
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 6


def test_a_reasoning_stream_reaches_the_openai_client_whole(bill: Bill) -> None:
    """Thinking then "Yes.": complete; the thinking reaches the client untouched (``reasoning_
    content`` in each delta's extra fields), and the usage chunk keeps
    ``completion_tokens_details.reasoning_tokens``; charged 20 + 6 as reported."""
    key_id, token = bill.key()
    stream = bill.client(token).chat.completions.create(
        **chat("stream_reasoning_answer", stream=True, stream_options={"include_usage": True})
    )
    thought, content, usage = "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            thought += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert (thought, content) == ("tttt", "Yes.")
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 4
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (PROMPT, 6)


def test_time_to_first_token_counts_thinking_as_tokens(bill: Bill) -> None:
    """The first thought comes at once, the answer's first word 1.5 s later: the gateway's
    time to first token (``ttft_ms`` in the access log, the histogram behind it) is the
    first generated token of any kind, thinking included (as vLLM's own
    ``vllm:time_to_first_token_seconds``), not the first word of ``content``."""
    _, token = bill.key()
    response, outcome = _outcome(bill, token, chat("stream_thinking_then_answer", stream=True))
    assert response.status_code == 200
    assert outcome == "complete"
    request_id = response.headers["x-request-id"]
    entry = bill.gateway.access_of(request_id)
    assert entry["duration_ms"] >= 1400
    assert entry["ttft_ms"] < 1000


# The request side: tool fields, tool history and thinking control.


def test_tool_fields_are_forwarded_and_a_request_with_tools_goes_precise(bill: Bill) -> None:
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``reasoning_effort`` reach the
    backend as sent; ``model: auto`` with tools goes to precise by the ``tools`` rule; the
    whole tool-call answer reaches the openai client with ``content`` None."""
    _, token = bill.key()
    body = chat("whole_tool_call", model="auto", tools=TOOLS, tool_choice="auto")
    body.update(parallel_tool_calls=False, reasoning_effort="low")
    raw = bill.client(token).chat.completions.with_raw_response.create(**body)
    assert (raw.headers["x-tiergate-tier"], raw.headers["x-tiergate-route-reason"]) == (
        "precise",
        "rule:tools",
    )
    message = raw.parse().choices[0].message
    assert message.content is None
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.name == "get_weather"
    sent = bill.forwarded()
    assert sent["tools"] == TOOLS
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("auto", False)
    assert sent["reasoning_effort"] == "low"


def _history(arguments: str) -> list[dict[str, Any]]:
    """A conversation after a tool call: the assistant's call (``content: null``) and the
    tool's answer, which names the backend's scenario."""
    function = {"name": "get_weather", "arguments": arguments}
    call = {"id": "call-1", "type": "function", "function": function}
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": "whole"},
    ]


def test_a_tool_call_history_is_accepted_and_counted_in_the_prompt_estimate(bill: Bill) -> None:
    """An assistant message with ``tool_calls`` and ``content: null``, then a ``tool``
    message: 200 and forwarded as sent; a long call's arguments weigh in the prompt estimate
    (what the token limit reserves before the backend counts)."""
    _, token = bill.key()
    body = {"model": "precise", "max_tokens": 50, "messages": _history('{"city": "Paris"}')}
    response = post(bill, token, body)
    assert response.status_code == 200, response.text
    assert bill.forwarded()["messages"] == body["messages"]
    long = validate({**body, "messages": _history(json.dumps({"city": "Paris" * 400}))}, "chat")
    short = validate(dict(body), "chat")
    assert long.prompt_token_estimate - short.prompt_token_estimate >= 2000 // 4


@pytest.mark.parametrize(
    "history",
    [
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "content": None, "tool_calls": "not a list"}],
        [{"role": "tool", "content": None, "tool_call_id": 5}],
    ],
)
def test_odd_tool_histories_are_never_a_500(bill: Bill, history: list[dict[str, Any]]) -> None:
    """Messages a tool-calling client may send wrong: a 200 or an OpenAI-shaped 4xx (from the
    gateway or passed through from the backend), never a 5xx."""
    _, token = bill.key()
    messages = [*history, {"role": "user", "content": "whole"}]
    body = {"model": "precise", "max_tokens": 50, "messages": messages}
    response = post(bill, token, body)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert set(response.json()["error"]) >= {"message", "type", "param", "code"}


def test_turning_thinking_off_is_allowed_for_every_key(bill: Bill) -> None:
    """``chat_template_kwargs: {"enable_thinking": false}`` (how Qwen3 is told not to think,
    which only shortens an answer) reaches the backend for a key without the
    ``engine_fields`` scope, through the openai client's ``extra_body``."""
    _, token = bill.key()
    answer = bill.client(token).chat.completions.create(
        **chat("whole"), extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert answer.choices[0].message.content
    assert bill.forwarded()["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enable_thinking": False, "chat_template": "{{ 7 * 7 }}"},
        {"enable_thinking": "no"},
        {"documents": [{"text": "x"}]},
        "enable_thinking",
    ],
)
def test_other_template_kwargs_still_need_the_engine_fields_scope(bill: Bill, kwargs: Any) -> None:
    """Anything else in ``chat_template_kwargs`` (a template of the caller's, values that are
    not booleans) is still refused for a key without the scope: OpenAI's 400 naming the
    field, nothing forwarded."""
    _, token = bill.key()
    with pytest.raises(openai.BadRequestError) as caught:
        bill.client(token).chat.completions.create(
            **chat("whole"), extra_body={"chat_template_kwargs": kwargs}
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == ("chat_template_kwargs", "field_not_allowed")
