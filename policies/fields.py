"""Which request fields are forwarded, for whom, and which media URLs may reach a backend.

Pure rules, applied after validation and tier choice (``gateway/http/proxy.py`` calls them):

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

_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "seed",
        "user",
        "response_format",
        "suffix",
    }
)
OPENAI_CHAT_FIELDS = _COMMON | frozenset(
    {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "modalities",
        "audio",
        "metadata",
        "store",
        "service_tier",
        "reasoning_effort",
        "prediction",
        "web_search_options",
        "verbosity",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
    }
)
OPENAI_COMPLETION_FIELDS = _COMMON | frozenset({"prompt", "echo", "best_of"})
# Sampling and output extras engines document; harmless to forward for any key.
SAMPLING_EXTRAS = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "cache_salt",
        "typical_p",
        "tfs_z",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "dynamic_temperature",
    }
)
STRUCTURED_OUTPUT_FIELDS = frozenset(
    {
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "json_schema",
        "grammar",
        "regex",
    }
)
# Fields that control the engine rather than the sampling: only with the engine_fields scope.
ENGINE_CONTROL_FIELDS = frozenset(
    {
        "priority",
        "chat_template",
        "chat_template_kwargs",
        "kv_transfer_params",
        "logits_processors",
        "vllm_xargs",
        "request_id",
        "prompt_logprobs",
        "use_beam_search",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "documents",
        "mm_processor_kwargs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "allowed_token_ids",
        "bad_words",
        "echo_prompt",
        "lora_request",
        "data_parallel_rank",
        "media_io_kwargs",
        "thinking_token_budget",
    }
)
# The one use of ``chat_template_kwargs`` open to every key: switching a reasoning model's
# thinking on or off (Qwen3's ``enable_thinking``, DeepSeek's and Granite's ``thinking``), as
# booleans and nothing else. Other kwargs reach the template, which may read anything it is
# given (a ``chat_template`` there was a template of the caller's in older vLLM).
THINKING_SWITCHES = frozenset({"enable_thinking", "thinking"})


def _thinking_switch(name: str, value: Any) -> bool:
    """``chat_template_kwargs`` that only turns thinking on or off (booleans, known names)."""
    return (
        name == "chat_template_kwargs"
        and isinstance(value, dict)
        and bool(value)
        and all(k in THINKING_SWITCHES and isinstance(v, bool) for k, v in value.items())
    )


# Keys a content part may carry media under. vLLM finds a part's media by these keys (and a
# part with a ``uuid`` by its keys alone), not by ``type``, so every part is searched for all.
MEDIA_KEYS = (
    "image_url",
    "input_image",
    "audio_url",
    "video_url",
    "input_audio",
    "file",
    "image",
    "video",
    "audio",
)
# Serialized tensors the engine loads as they are: only with the engine_fields scope.
EMBEDDING_KEYS = ("image_embeds", "audio_embeds", "video_embeds", "prompt_embeds")
_URL_FORBIDDEN = frozenset("\\") | frozenset(chr(c) for c in range(0x21)) | {chr(0x7F)}

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
    for name, value in body.items():
        if name in allowed or name in SAMPLING_EXTRAS or name in policy.extra_allowed:
            continue
        if name in STRUCTURED_OUTPUT_FIELDS:
            if structured_outputs:
                continue
            raise InvalidRequest(
                f"'{name}': this route does not support structured outputs.",
                param=name,
                code="unsupported_parameter",
            )
        if name in ENGINE_CONTROL_FIELDS:
            if engine_fields or _thinking_switch(name, value):
                continue
            raise InvalidRequest(
                f"'{name}' controls the inference engine; this key may not send it.",
                param=name,
                code="field_not_allowed",
            )
        if name in STEERING_FIELDS:
            continue  # already removed by validation; never forwarded
        unknown.append(name)
    if not unknown:
        return
    if policy.unknown == "reject":
        raise InvalidRequest(
            f"Unrecognized request argument supplied: '{unknown[0]}'.",
            param=unknown[0],
            code="unsupported_parameter",
        )
    for name in unknown:
        del body[name]


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, IPv4-translated, 6to4, Teredo)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or ip in _NAT64_LOCAL or ip in _TRANSLATED:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


@dataclass(frozen=True, slots=True)
class MediaUrl:
    """A URL found in a media part, with the parameter path to name in errors."""

    param: str
    url: str


def _part_urls(part: dict[str, Any]) -> Iterator[str]:
    for kind in MEDIA_KEYS:
        inner = part.get(kind)
        if isinstance(inner, str):
            yield inner
        elif isinstance(inner, dict):
            for key in ("url", "file_data", "data", "image_url"):
                value = inner.get(key)
                if isinstance(value, str) and (key in ("url", "image_url") or ":" in value[:16]):
                    yield value


def _content_parts(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each object content part of a chat body's messages, with its parameter path."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict):
                yield f"messages[{i}].content[{j}]", part


def has_content_parts(body: dict[str, Any]) -> bool:
    """Whether any message of a chat body has a list of content parts (plain text has none,
    so neither media nor embeddings: the checks that walk the parts can be skipped)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            return True
    return False


def embedding_parts(body: dict[str, Any]) -> list[str]:
    """The parameter paths of raw-embedding content parts in a chat body."""
    return [
        param
        for param, part in _content_parts(body)
        if part.get("type") in EMBEDDING_KEYS or any(k in part for k in EMBEDDING_KEYS)
    ]


def media_urls(body: dict[str, Any]) -> list[MediaUrl]:
    """Every URL in the media parts of a chat body's messages."""
    return [
        MediaUrl(param, url) for param, part in _content_parts(body) for url in _part_urls(part)
    ]


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
        raise InvalidRequest(
            f"'{media.param}': only data: and http(s) URLs are accepted.",
            param=media.param,
            code="invalid_media_url",
        )
    if not remote_allowed:
        raise InvalidRequest(
            f"'{media.param}': this route accepts inline (data:) media only, not URLs.",
            param=media.param,
            code="remote_media_not_allowed",
        )
    try:
        parts = urlsplit(url)
        host, port, netloc = parts.hostname, parts.port, parts.netloc
    except ValueError:
        host, port, netloc = None, None, ""
    # Parsers disagree on backslashes, user info and control characters (``http://a\@b/``
    # is host b here and host a to urllib3): a URL the fetcher could read differently is refused.
    if _URL_FORBIDDEN.intersection(url) or "@" in netloc:
        raise InvalidRequest(
            f"'{media.param}': the URL has characters or user info that parsers read differently.",
            param=media.param,
            code="invalid_media_url",
        )
    if not host:
        raise InvalidRequest(
            f"'{media.param}': the URL has no valid host.",
            param=media.param,
            code="invalid_media_url",
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host, port or (443 if scheme == "https" else 80)
    check_address(media, str(address))
    return None


def check_address(media: MediaUrl, address: str) -> None:
    """Refuse a media URL whose host is (or resolves to) a non-global address."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
        address.split("%", 1)[0]
    )
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _embedded_ipv4(ip) or ip
    if not ip.is_global or ip.is_multicast:
        raise InvalidRequest(
            f"'{media.param}': the URL points at a private, loopback, link-local or "
            "metadata address.",
            param=media.param,
            code="media_url_forbidden",
        )
