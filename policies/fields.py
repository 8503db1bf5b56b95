"""Which request fields are forwarded, for whom, and which media URLs may reach a backend.

Pure rules, applied after validation and tier choice (``gateway/proxy.py`` calls them):

- the fields of OpenAI's chat and completions APIs, plus the sampling extras that vLLM,
  SGLang and llama.cpp document (``top_k``, ``min_p``, ``repetition_penalty``...), are
  forwarded for every key;
- structured-output fields (``structured_outputs`` and the older ``guided_*``) where the tier
  supports them;
- engine control fields (``priority``, ``chat_template``, ``kv_transfer_params``,
  ``logits_processors``, ``vllm_xargs``, ``request_id``...) only for keys with the
  ``engine_fields`` scope: they let a caller jump queues, run a Jinja template, or point the
  engine at another host;
- anything else is refused with a 400 naming the field (like OpenAI's API), or dropped when
  the operator says so; operators may allow more fields by name.

Media parts (``image_url``, ``audio_url``, ``video_url``, ``input_audio``, ``file``) may carry
``data:`` URLs (bounded by the body limit); ``http(s)`` URLs only where the tier allows remote
media, and never to a non-global address (checked by the gateway after resolving the host).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from policies.errors import InvalidRequest
from policies.requests import STEERING_FIELDS, RequestKind

_COMMON = frozenset({
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "seed", "user",
    "response_format", "suffix",
})
OPENAI_CHAT_FIELDS = _COMMON | frozenset({
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "functions", "function_call", "modalities", "audio", "metadata",
    "store", "service_tier", "reasoning_effort", "prediction", "web_search_options",
    "verbosity", "prompt_cache_key", "safety_identifier",
})
OPENAI_COMPLETION_FIELDS = _COMMON | frozenset({"prompt", "echo", "best_of"})
# Sampling and output extras engines document; harmless to forward for any key.
SAMPLING_EXTRAS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "ignore_eos",
    "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "cache_salt", "typical_p",
    "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta", "dynamic_temperature",
})
STRUCTURED_OUTPUT_FIELDS = frozenset({
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "json_schema", "grammar", "regex",
})
# Fields that control the engine rather than the sampling: only with the engine_fields scope.
ENGINE_CONTROL_FIELDS = frozenset({
    "priority", "chat_template", "chat_template_kwargs", "kv_transfer_params",
    "logits_processors", "vllm_xargs", "request_id", "prompt_logprobs", "use_beam_search",
    "add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
    "mm_processor_kwargs", "return_tokens_as_token_ids", "return_token_ids",
    "allowed_token_ids", "bad_words", "echo_prompt", "lora_request", "data_parallel_rank",
    "media_io_kwargs", "thinking_token_budget",
})
MEDIA_PART_TYPES = ("image_url", "audio_url", "video_url", "input_audio", "file")

UnknownFields = Literal["reject", "drop"]


@dataclass(frozen=True, slots=True)
class FieldPolicy:
    """The operator's choices (``requests:`` settings)."""

    unknown: UnknownFields = "reject"
    extra_allowed: frozenset[str] = field(default_factory=frozenset)


def check_fields(
    body: dict[str, Any],
    kind: RequestKind,
    policy: FieldPolicy,
    *,
    engine_fields: bool,
    structured_outputs: bool,
) -> None:
    """Refuse (400 naming the field) or drop what this key may not send to this tier."""
    allowed = OPENAI_CHAT_FIELDS if kind == "chat" else OPENAI_COMPLETION_FIELDS
    unknown: list[str] = []
    for name in body:
        if name in allowed or name in SAMPLING_EXTRAS or name in policy.extra_allowed:
            continue
        if name in STRUCTURED_OUTPUT_FIELDS:
            if structured_outputs:
                continue
            raise InvalidRequest(
                f"'{name}': this route does not support structured outputs.",
                param=name, code="unsupported_parameter",
            )
        if name in ENGINE_CONTROL_FIELDS:
            if engine_fields:
                continue
            raise InvalidRequest(
                f"'{name}' controls the inference engine; this key may not send it.",
                param=name, code="field_not_allowed",
            )
        if name in STEERING_FIELDS:
            continue  # already removed by validation; never forwarded
        unknown.append(name)
    if not unknown:
        return
    if policy.unknown == "reject":
        raise InvalidRequest(
            f"Unrecognized request argument supplied: '{unknown[0]}'.",
            param=unknown[0], code="unsupported_parameter",
        )
    for name in unknown:
        del body[name]


@dataclass(frozen=True, slots=True)
class MediaUrl:
    """A URL found in a media part, with the parameter path to name in errors."""

    param: str
    url: str


def _part_urls(part: dict[str, Any]) -> Iterator[str]:
    kind = part.get("type")
    if kind not in MEDIA_PART_TYPES:
        return
    inner = part.get(kind)
    if isinstance(inner, str):
        yield inner
    elif isinstance(inner, dict):
        for key in ("url", "file_data", "data"):
            value = inner.get(key)
            if isinstance(value, str) and (key == "url" or ":" in value[:16]):
                yield value


def media_urls(body: dict[str, Any]) -> list[MediaUrl]:
    """Every URL in the media parts of a chat body's messages."""
    found: list[MediaUrl] = []
    messages = body.get("messages")
    if not isinstance(messages, list):
        return found
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict):
                param = f"messages[{i}].content[{j}]"
                found.extend(MediaUrl(param, url) for url in _part_urls(part))
    return found


def remote_host(media: MediaUrl, *, remote_allowed: bool) -> tuple[str, int] | None:
    """``None`` for an inline ``data:`` URL; the (host, port) to resolve for a remote one.

    Raises :class:`InvalidRequest` for any other scheme, for remote media where the tier does
    not allow it, and for a literal address that is not globally routable.
    """
    url = media.url.strip()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return None
    if scheme not in ("http", "https"):
        raise InvalidRequest(f"'{media.param}': only data: and http(s) URLs are accepted.",
                             param=media.param, code="invalid_media_url")
    if not remote_allowed:
        raise InvalidRequest(
            f"'{media.param}': this route accepts inline (data:) media only, not URLs.",
            param=media.param, code="remote_media_not_allowed",
        )
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host:
        raise InvalidRequest(f"'{media.param}': the URL has no valid host.",
                             param=media.param, code="invalid_media_url")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host, port or (443 if scheme == "https" else 80)
    check_address(media, str(address))
    return None


def check_address(media: MediaUrl, address: str) -> None:
    """Refuse a media URL whose host is (or resolves to) a non-global address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    if not ip.is_global or ip.is_multicast:
        raise InvalidRequest(
            f"'{media.param}': the URL points at a private, loopback, link-local or "
            "metadata address.",
            param=media.param, code="media_url_forbidden",
        )
