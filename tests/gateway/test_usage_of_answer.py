"""A non-streaming answer's usage, read without decoding the rest: the same counts as a full
decode for every shape a backend may send, and None where there are none."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.events import Usage
from gateway.relay import usage_from, usage_of_answer

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": 'a "usage": trap'}}],
}


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps({**ANSWER, "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        json.dumps(
            {
                "usage": {
                    "prompt_tokens": 9,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 4},
                },
                **ANSWER,
            }
        ),
        json.dumps({**ANSWER, "usage": {"prompt_tokens": -5, "completion_tokens": None}}),
        json.dumps({**ANSWER, "usage": None}),
        json.dumps({**ANSWER, "usage": "lots"}),
        json.dumps(ANSWER),
        '{"usage": {"prompt_tokens": 1}, "usage": {"prompt_tokens": 2}}',
        json.dumps([{"usage": {"prompt_tokens": 1}}]),
        '"usage"',
        '{"usage": {"prompt_tokens": 1}',
        "",
    ],
)
def test_the_same_usage_as_a_full_decode(raw: str) -> None:
    """Whatever the body, the usage-only read agrees with decoding the whole answer."""
    try:
        full: Any = msgspec.json.decode(raw.encode())
    except msgspec.DecodeError:
        expected = None
    else:
        expected = usage_from(full)
    assert usage_of_answer(raw.encode()) == expected


def test_counts_are_read() -> None:
    """A typical vLLM answer: prompt, completion and cached tokens."""
    raw = json.dumps(
        {
            **ANSWER,
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 5,
                "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        }
    ).encode()
    assert usage_of_answer(raw) == Usage(12, 5, 8)
