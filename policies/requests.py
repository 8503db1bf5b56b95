"""Validation of OpenAI request bodies, before anything is forwarded.

Pure functions: they take the decoded JSON body and return a small summary that later stages
use (tier choice, token reservation, prefix key), or raise :class:`InvalidRequest` naming the
offending ``param``. Unknown fields are left in the body untouched (vLLM accepts many extras);
fields that could steer the upstream (``api_base`` and friends) are removed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from policies.errors import InvalidRequest

RequestKind = Literal["chat", "completion"]
# /v1/completions without max_tokens: 16 tokens, as OpenAI's legacy API and vLLM define it.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# Fields some gateways honour to pick an upstream; ours never does (LiteLLM CVE-2024-6587).
STEERING_FIELDS = ("api_base", "base_url", "api_key", "custom_llm_provider", "api_version")
_STEERING = frozenset(STEERING_FIELDS)

_NUMBER_PARAMS = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})
_CHARS_PER_TOKEN = 4
# The chat template's own tokens around each message: ChatML (Qwen) writes
# ``<|im_start|>role\n ... <|im_end|>\n``, Llama 3 ``<|start_header_id|>role<|end_header_id|>\n\n
# ... <|eot_id|>``: five tokens each. Without them a chat of many short turns (3,000 of "ok")
# was estimated at a sixth of what the backend counts and escaped the long-prompt rule.
_TEMPLATE_CHARS = 5 * _CHARS_PER_TOKEN
# What the prompt estimate counts besides message text (see RequestSummary.prompt_chars):
# serialized JSON at three characters a token, a non-text content part (an image, audio, a
# file) as a flat 512 tokens, and text outside ASCII by its UTF-8 size at three bytes a token.
_BODY_FIELDS_COUNTED = frozenset({"tools", "functions", "response_format"})
# Where an engine takes a JSON schema for the answer beside ``response_format``: vLLM's
# ``structured_outputs.json`` and older ``guided_json``, llama.cpp's ``json_schema``.
_ENGINE_SCHEMA_FIELDS = frozenset({"structured_outputs", "guided_json", "json_schema"})
# ``response_format`` types that carry a JSON schema in an engine's spelling: TGI's grammar
# (``{"type": "json", "value": schema}``, ``json_object`` its alias) and llama.cpp's
# ``{"type": "json_object", "schema": schema}``.
_SCHEMA_TYPE_ALIASES = frozenset({"json", "json_object"})
_MESSAGE_FIELDS_NOT_EXTRA = frozenset({"role", "content"})
_MEDIA_PART_CHARS = 512 * _CHARS_PER_TOKEN


class RequestSummary(NamedTuple):
    """What the gateway needs to know about a validated request."""

    kind: RequestKind
    model: str
    stream: bool
    max_tokens: int | None
    include_usage: bool
    # Weighted characters, four to a token: message or prompt text (ASCII as is; other text
    # by UTF-8 size, so one CJK character is a token), plus what the backend also renders into
    # the prompt: the chat template's tokens around each message (five), tool and function
    # definitions, assistant tool calls and their arguments, a response_format schema
    # (serialized, three characters a token), and 512 tokens for each non-text content part.
    prompt_chars: int
    has_tools: bool
    response_format: str | None
    n: int = 1
    best_of: int | None = None
    prompts: int = 1
    # The name the caller used for the effective completion cap, for error messages.
    max_tokens_param: str = "max_tokens"

    @property
    def completions(self) -> int:
        """How many completions the backend generates: ``max(n, best_of)`` per prompt."""
        return max(self.n, self.best_of or 1) * self.prompts

    @property
    def prompt_token_estimate(self) -> int:
        """A cheap upper-ish estimate of prompt tokens (about four characters a token)."""
        return self.prompt_chars // _CHARS_PER_TOKEN + 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def text_tokens(text: str) -> int:
    """A rough count of ``text``'s tokens, as the prompt estimate counts (about four
    characters a token); at least 1 for any text."""
    return -(-_text_chars(text) // _CHARS_PER_TOKEN)


def _text_chars(text: str) -> int:
    """``text``'s weight, four to a token: ASCII as is, other text three UTF-8 bytes a token.

    ``isascii`` is a flag check in CPython, so ASCII text costs nothing more than ``len``.
    Three bytes a token makes a CJK character one token (real tokenizers: about 1 to 1.5)
    and overestimates two-byte scripts (Cyrillic, Greek, accented Latin); dense ASCII
    (punctuation runs, digits, base64) stays at four characters a token.
    """
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass")) * _CHARS_PER_TOKEN // 3


def _json_chars(value: object) -> int:
    """The weight of a decoded JSON value as the backend renders it: serialized, 3 a token."""
    return len(json.dumps(value)) * _CHARS_PER_TOKEN // 3


def _content_chars(content: object, param: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content) if content.isascii() else _text_chars(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if not isinstance(part, dict):
                raise InvalidRequest(f"'{param}' parts must be objects.", param=param)
            text = part.get("text")
            if isinstance(text, str):
                total += _text_chars(text)
            kind = part.get("type")
            # Media (found by its keys; a "text" key beside them changes nothing), or a typed
            # part other than text; an untyped part with only "text" is text.
            if kind != "text" and (kind is not None or len(part) > (text is not None)):
                total += _MEDIA_PART_CHARS
        return total
    raise InvalidRequest(f"'{param}' must be a string or a list of parts.", param=param)


def _messages_chars(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    total = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"'messages[{i}]' must be an object.", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(
                f"'messages[{i}].role' must be a non-empty string.", param=f"messages[{i}].role"
            )
        total += _TEMPLATE_CHARS + _content_chars(message.get("content"), f"messages[{i}].content")
        if len(message) > 2:  # more than role and content: tool calls, a name, a call id
            total += _message_extra_chars(message)
    return total


def _message_extra_chars(message: dict[str, Any]) -> int:
    """The weight of a message's fields besides role and content (``tool_calls`` above all)."""
    return sum(
        _json_chars(value)
        for name, value in message.items()
        if value and name not in _MESSAGE_FIELDS_NOT_EXTRA
    )


def _body_extra_chars(body: dict[str, Any]) -> int:
    """The weight of tool and function definitions and a response_format schema."""
    return sum(_json_chars(body[name]) for name in _BODY_FIELDS_COUNTED & body.keys() if body[name])


def _prompt_chars(prompt: object) -> int:
    if isinstance(prompt, str):
        return _text_chars(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(_text_chars(p) for p in prompt)
        if all(_is_int(p) for p in prompt):
            return len(prompt) * _CHARS_PER_TOKEN
        if all(_token_ids(p) for p in prompt):  # several prompts of token ids
            return sum(len(p) for p in prompt) * _CHARS_PER_TOKEN
    raise InvalidRequest(
        "'prompt' must be a string, an array of strings, an array of token ids or an array "
        "of arrays of token ids.",
        param="prompt",
    )


def _token_ids(prompt: object) -> bool:
    """A non-empty array of token ids (one prompt of a list of them)."""
    return isinstance(prompt, list) and bool(prompt) and all(_is_int(t) for t in prompt)


def _check_scalars(body: dict[str, Any]) -> tuple[bool, int | None, str]:
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    for name, value in body.items():  # the body's own order: the first bad one is named
        if name in _NUMBER_PARAMS and value is not None and not _is_number(value):
            raise InvalidRequest(f"'{name}' must be a number.", param=name)
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise InvalidRequest(f"'{name}' must be a positive integer.", param=name)
    max_tokens: int | None = None
    param = "max_tokens"
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise InvalidRequest(f"'{name}' must be a positive integer.", param=name)
        if max_tokens is None or value > max_tokens:
            max_tokens, param = value, name
    return bool(stream), max_tokens, param


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    return bool(options.get("include_usage"))


def _response_format(body: dict[str, Any]) -> str | None:
    """The answer's format: ``response_format``'s type, or ``json_schema`` when a JSON schema
    constrains the answer in an engine's own field or spelling instead (the same constraint,
    and the same rule, whichever field carries it)."""
    if not _ENGINE_SCHEMA_FIELDS.isdisjoint(body) and _engine_schema(body):
        return "json_schema"
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise InvalidRequest(
            "'response_format' must be an object with a 'type'.", param="response_format"
        )
    kind = str(fmt["type"])
    if kind in _SCHEMA_TYPE_ALIASES and (
        fmt.get("value") is not None or fmt.get("schema") is not None
    ):
        return "json_schema"
    return kind


def _engine_schema(body: dict[str, Any]) -> bool:
    """Does an engine field carry a JSON schema (``structured_outputs.json``, ``guided_json``,
    ``json_schema``)? A regex, grammar or choice list does not count."""
    if body.get("guided_json") is not None or body.get("json_schema") is not None:
        return True
    structured = body.get("structured_outputs")
    return isinstance(structured, dict) and structured.get("json") is not None


def json_depth(value: object) -> int:
    """How deeply objects and arrays nest in a decoded JSON value (a scalar is 0).

    Iterative, so a hostile body cannot exhaust the interpreter's stack.
    """
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def validate(body: object, kind: RequestKind) -> RequestSummary:
    """Check ``body`` for ``kind`` and summarise it; removes upstream-steering fields."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string.", param="model")
    if kind == "chat":
        chars = _messages_chars(body.get("messages"))
    else:
        chars = _prompt_chars(body.get("prompt"))
    stream, max_tokens, max_tokens_param = _check_scalars(body)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array.", param="tools")
    if not _STEERING.isdisjoint(body):
        for name in STEERING_FIELDS:
            body.pop(name, None)
    if not _BODY_FIELDS_COUNTED.isdisjoint(body):  # plain requests: this one set operation
        chars += _body_extra_chars(body)
    prompt = body.get("prompt")
    best_of = body.get("best_of")
    return RequestSummary(
        kind=kind,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        include_usage=_include_usage(body),
        prompt_chars=chars,
        has_tools=bool(tools) and body.get("tool_choice") != "none",  # "none": no tool use
        response_format=_response_format(body),
        n=body.get("n") or 1,
        best_of=best_of if _is_int(best_of) else None,
        prompts=_prompt_count(prompt) if kind == "completion" else 1,
        max_tokens_param=max_tokens_param,
    )


def _prompt_count(prompt: object) -> int:
    """Prompts in a completion request: a list of strings or of token-id lists is several,
    token ids are one."""
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        return len(prompt)
    return 1


def check_completions(summary: RequestSummary, max_n: int) -> None:
    """``n``, ``best_of`` and list prompts within the key's ``max_n`` completions a request."""
    if summary.completions <= max_n:
        return
    per_prompt = max(summary.n, summary.best_of or 1)
    if per_prompt <= max_n:
        param = "prompt"
    else:
        param = "best_of" if (summary.best_of or 0) > summary.n else "n"
    raise InvalidRequest(
        f"The request asks for {summary.completions} completions ('{param}'); this key "
        f"allows {max_n} per request.",
        param=param,
        code="n_exceeded",
    )


def default_max_tokens(
    tier_defaults: Iterable[int], key_cap: int | None, kind: RequestKind, *, lowest: bool = False
) -> int:
    """The ``max_tokens`` for a request that sets none: the key's cap over the tiers' defaults.

    The highest default (to reserve before the tier is known) or the lowest (to write into a
    body any of these tiers may serve); text completions keep the API's own default of 16.
    """
    values = list(tier_defaults)
    bound = min(values) if lowest else max(values)
    if kind == "completion":
        bound = min(bound, COMPLETIONS_DEFAULT_MAX_TOKENS)
    return bound if key_cap is None else min(bound, key_cap)
