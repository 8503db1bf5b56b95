"""The gateway in front of simulated reasoning models (``--reasoning-tokens``), with the
official ``openai`` client: thinking reaches the caller apart from the answer, counts as
output, and an answer that was all thinking is a success, not a broken one.

The fast tier answers as vLLM 0.11 (thinking in ``reasoning_content``), precise as current
vLLM (``reasoning``); each chat answer's first 4 tokens are thinking.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.stack import FAST_SIM, PRECISE_SIM, Stack, running_stack

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

THINKING = 4
FIELDS = {"fast": "reasoning_content", "precise": "reasoning"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    thinking = ("--reasoning-tokens", str(THINKING))
    sims = ((*FAST_SIM, *thinking, "--vllm-version", "0.11"), (*PRECISE_SIM, *thinking))
    with running_stack(sims=sims) as running:
        yield running


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="unused", max_retries=0)


def _ask(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        "max_tokens": max_tokens,
        "extra_body": {"ignore_eos": True},
        **extra,
    }


@pytest.mark.parametrize("tier", ["fast", "precise"])
def test_a_streamed_answer_thinks_then_answers_and_counts_both(stack: Stack, tier: str) -> None:
    """10 tokens: 4 of thinking (each in its release's field, never in ``content``), then 6
    of answer; the usage chunk counts all 10; the stream ends complete."""
    stream = _client(stack).chat.completions.create(
        model=tier, stream=True, stream_options={"include_usage": True}, **_ask(10)
    )
    thoughts, words, usage, finish = 0, 0, None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            extra = choice.delta.model_extra or {}
            thoughts += bool(extra.get(FIELDS[tier]))
            words += bool(choice.delta.content)
            assert not (extra.get(FIELDS[tier]) and choice.delta.content)
    assert (thoughts, words, finish) == (THINKING, 6, "length")
    assert usage is not None
    assert usage.completion_tokens == 10


@pytest.mark.parametrize("tier", ["fast", "precise"])
def test_a_whole_answer_keeps_its_thinking_apart(stack: Stack, tier: str) -> None:
    """The thinking in the message's own field, the answer in ``content``, 10 tokens."""
    answer = _client(stack).chat.completions.create(model=tier, **_ask(10))
    message = answer.choices[0].message
    assert (message.model_extra or {}).get(FIELDS[tier])
    assert message.content
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 10


def test_an_answer_that_is_all_thinking_is_a_success(stack: Stack) -> None:
    """``max_tokens`` 3 runs out while thinking: ``content`` null, ``finish_reason`` length,
    a 200 with its usage (3), never a 502; the stream of it ends complete (``[DONE]``)."""
    client = _client(stack)
    answer = client.chat.completions.create(model="precise", **_ask(3))
    message = answer.choices[0].message
    assert (message.content, answer.choices[0].finish_reason) == (None, "length")
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 3
    body = {"model": "precise", "stream": True, "ignore_eos": True, **_ask(3)}
    del body["extra_body"]
    response = stack.post(body)
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
    assert '"content":"' not in response.text.replace('"content":""', "")
