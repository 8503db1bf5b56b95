"""Request validation: what is accepted, what is refused and with which param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies.errors import InvalidRequest
from policies.requests import RequestKind, check_completions, default_max_tokens, validate

CHAT = [{"role": "user", "content": "hello"}]


def test_chat_summary() -> None:
    """A valid chat body is summarised: stream, max_tokens, usage option, size."""
    body = {
        "model": "auto",
        "messages": CHAT,
        "stream": True,
        "max_tokens": 10,
        "stream_options": {"include_usage": True},
    }
    summary = validate(body, "chat")
    assert summary.stream
    assert summary.max_tokens == 10
    assert summary.include_usage
    assert summary.prompt_chars == 5 + 20  # "hello", and the template's five tokens around it
    assert summary.prompt_token_estimate >= 1


def test_multimodal_parts_and_tool_messages_are_accepted() -> None:
    """Content parts and assistant messages without content are valid."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    # the image part and the (empty) tool_calls: 512 tokens for the image, nothing for []
    # two messages: five template tokens each, 3 characters of text, one 512-token image
    assert (
        validate({"model": "m", "messages": messages}, "chat").prompt_chars == 2 * 20 + 3 + 512 * 4
    )


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_completion_prompt_forms(prompt: Any) -> None:
    """Completion prompts may be a string, strings, token ids or lists of token ids."""
    assert validate({"model": "m", "prompt": prompt}, "completion").kind == "completion"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": 3}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": ["a", 1]}, "prompt"),
        ({"model": "m", "prompt": [[1], []]}, "prompt"),
        ({"model": "m", "prompt": [[1], "a"]}, "prompt"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_completion_tokens": -1}, "max_completion_tokens"),
        ({"model": "m", "prompt": "x", "stream_options": "yes"}, "stream_options"),
        ({"model": "m", "prompt": "x", "response_format": "json"}, "response_format"),
        ({"model": "m", "prompt": "x", "tools": {}}, "tools"),
        ({"model": "", "prompt": "x"}, "model"),
    ],
)
def test_invalid_fields_name_their_param(body: dict[str, Any], param: str) -> None:
    """Each invalid field raises InvalidRequest naming it."""
    with pytest.raises(InvalidRequest) as err:
        validate(body, "completion")
    assert err.value.param == param
    assert err.value.status == 400


def test_non_object_body_is_refused() -> None:
    """A JSON array or scalar is not a request."""
    with pytest.raises(InvalidRequest):
        validate([1, 2], "chat")


def test_steering_fields_are_removed_and_extras_kept() -> None:
    """api_base/base_url/api_key are dropped; unknown vLLM extras stay."""
    body = {"model": "m", "messages": CHAT, "api_base": "x", "base_url": "y", "top_k": 3}
    validate(body, "chat")
    assert "api_base" not in body
    assert "base_url" not in body
    assert body["top_k"] == 3


@pytest.mark.parametrize(
    ("body", "completions"),
    [
        ({"prompt": "hi"}, 1),
        ({"prompt": "hi", "n": 3}, 3),
        ({"prompt": "hi", "n": 2, "best_of": 5}, 5),
        ({"prompt": ["a", "b", "c"], "n": 2}, 6),
        ({"prompt": [1, 2, 3]}, 1),
        ({"prompt": [[1, 2], [3]], "n": 2}, 4),
    ],
)
def test_completions_count_n_best_of_and_list_prompts(
    body: dict[str, Any], completions: int
) -> None:
    """A request generates max(n, best_of) completions for each prompt of a list prompt."""
    summary = validate({"model": "auto", **body}, "completion")
    assert summary.completions == completions


def test_best_of_must_be_a_positive_integer() -> None:
    """best_of of zero is refused naming the param."""
    with pytest.raises(InvalidRequest) as info:
        validate({"model": "auto", "prompt": "hi", "best_of": 0}, "completion")
    assert info.value.param == "best_of"


@pytest.mark.parametrize(
    ("defaults", "key_cap", "kind", "lowest", "expected"),
    [
        ([4096, 1024], None, "chat", False, 4096),
        ([4096, 1024], None, "chat", True, 1024),
        ([4096, 1024], 256, "chat", False, 256),
        ([4096], None, "completion", False, 16),
        ([8], None, "completion", False, 8),
    ],
)
def test_default_max_tokens(
    defaults: list[int], key_cap: int | None, kind: RequestKind, lowest: bool, expected: int
) -> None:
    """The key's cap over the tiers' defaults; completions keep the API default of 16."""
    assert default_max_tokens(defaults, key_cap, kind, lowest=lowest) == expected


def test_check_completions_names_the_field() -> None:
    """Above max_n, the error names n, best_of or prompt, with code n_exceeded."""
    summary = validate({"model": "m", "prompt": ["a", "b"], "n": 2}, "completion")
    check_completions(summary, 4)
    with pytest.raises(InvalidRequest) as info:
        check_completions(summary, 3)
    assert (info.value.param, info.value.code) == ("prompt", "n_exceeded")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"f{i}",
            "description": "x " * 300,
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for i in range(4)
]


def _estimate(body: dict[str, Any]) -> int:
    return validate({"model": "m", "messages": CHAT, **body}, "chat").prompt_token_estimate


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": TOOLS},
        {"functions": [tool["function"] for tool in TOOLS]},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"description": "y " * 1200}},
            }
        },
    ],
)
def test_definitions_and_schemas_count_towards_the_prompt_estimate(extra: dict[str, Any]) -> None:
    """Tools, functions and a response_format schema are prompt tokens: at least their size / 4."""
    size = len(json.dumps(next(iter(extra.values()))))
    assert _estimate(extra) >= size // 4
    assert _estimate({}) == 7  # "hello" and the template around it


def test_tool_call_arguments_count_towards_the_prompt_estimate() -> None:
    """An assistant message's tool_calls (arguments included) count, not only message text."""
    arguments = json.dumps({"a": "y " * 1200})
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    summary = validate({"model": "m", "messages": messages}, "chat")
    assert summary.prompt_token_estimate >= len(arguments) // 4


@pytest.mark.parametrize(
    ("text", "at_least"),
    [("汉字" * 600, 1200), ("привет " * 100, 300), ("hello world " * 100, 300)],
)
def test_text_outside_ascii_is_weighed_by_its_utf8_size(text: str, at_least: int) -> None:
    """CJK text counts about a token a character; ASCII stays at four characters a token. The
    same text as a completion prompt counts the same, less the chat template's five tokens."""
    estimate = validate({"model": "m", "messages": [{"role": "user", "content": text}]}, "chat")
    assert at_least <= estimate.prompt_token_estimate <= at_least * 2
    completion = validate({"model": "m", "prompt": text}, "completion")
    assert completion.prompt_token_estimate == estimate.prompt_token_estimate - 5


def test_a_media_part_with_an_empty_text_key_still_counts_as_media() -> None:
    """vLLM finds a part's media by its keys: `"text": ""` beside an image must not make the
    part free (20 such images passed a tpm-3000 key at 8 tokens)."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    plain = validate(
        {"model": "m", "messages": [{"role": "user", "content": [image] * 10}]}, "chat"
    )
    dressed = validate(
        {"model": "m", "messages": [{"role": "user", "content": [{**image, "text": ""}] * 10}]},
        "chat",
    )
    assert dressed.prompt_token_estimate >= plain.prompt_token_estimate >= 5000
