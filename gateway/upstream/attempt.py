"""The gateway's pooled HTTP client to the backends and one attempt against one replica.

Everything the gateway asks a backend goes through its own keep-alive client
(:mod:`gateway.upstream.pool`), faster per request than aiohttp (bench/results/client.md):
attempts and shadow calls on one pool, health probes and ops checks on a second pool of the
same client, so a probe never waits for a connection behind the request path's traffic.
Both are opened at start-up and closed at shutdown; no redirects are followed; the caller's
credentials are never forwarded.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gateway.pipeline.deadline import deadline
from gateway.pipeline.events import UNREADABLE_JSON, FailureKind, Usage, status_kind
from gateway.upstream.connection import ConnectFailed, ConnectTimedOut, Response
from gateway.upstream.keys import blank
from gateway.upstream.pool import UpstreamPool
from policies.agreement import tool_call_text
from policies.requests import text_tokens

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
# The largest non-streaming answer read from a backend (a chat answer is some kB; a batch of
# long completions or many embeddings a few MB).
MAX_ANSWER = 32 << 20


class _Answer(msgspec.Struct):
    """A non-streaming answer: a JSON object (checked whole); its ``usage`` kept, and what
    tells an error object from an answer (``error``, ``object``, whether ``choices`` is there:
    its value is not built)."""

    usage: Any = None
    error: Any = None
    object: Any = None
    choices: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_answer_decoder = msgspec.json.Decoder(_Answer)
_BOM = b"\xef\xbb\xbf"

# Upstream failures that mean "this replica, right now" and are worth another replica.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
# The backend refused the gateway's own credentials: a configuration error, never the caller's.
AUTH_STATUSES = frozenset({401, 403})


class UpstreamClient:
    """The pooled client of a gateway process: built with the other long-lived objects,
    opened at start-up (on the event loop), closed at shutdown.

    ``pool`` (attempts, shadow calls) and ``probes`` (health probes, ops checks) are for use
    while open; ``current_pool`` may be asked at any time (``None`` while closed).
    """

    __slots__ = ("_pool", "_probes", "keepalive_s", "limit_per_host")

    def __init__(
        self,
        *,
        pool: UpstreamPool | None = None,
        limit_per_host: int = 0,
        keepalive_s: float = 30.0,
    ) -> None:
        self._pool = pool
        self._probes: UpstreamPool | None = None
        self.limit_per_host = limit_per_host
        self.keepalive_s = keepalive_s

    def current_pool(self) -> UpstreamPool | None:
        """The open connection pool, if any (shadow calls ask at any time)."""
        return self._pool

    @property
    def probes(self) -> UpstreamPool:
        """The open pool of health probes and ops checks (RuntimeError before start-up)."""
        probes = self._probes
        if probes is None:
            raise RuntimeError("the upstream client is opened at start-up")
        return probes

    @property
    def pool(self) -> UpstreamPool:
        """The open connection pool of the request path (RuntimeError before start-up)."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("the upstream pool is opened at start-up")
        return pool

    def open(self) -> UpstreamPool:
        """Open both pools (once), on the event loop that uses them; return the probes' pool."""
        if self._probes is None:
            self._probes = UpstreamPool(
                limit_per_host=self.limit_per_host, keepalive_s=self.keepalive_s
            )
        if self._pool is None:
            self._pool = UpstreamPool(
                limit_per_host=self.limit_per_host, keepalive_s=self.keepalive_s
            )
        return self._probes

    async def close(self) -> None:
        """Close both pools, if open."""
        probes, self._probes = self._probes, None
        pool, self._pool = self._pool, None
        for each in (pool, probes):
            if each is not None:
                await each.close()


class AttemptFailed(Exception):
    """One attempt against one replica failed; ``kind`` says how, for retries and metrics.

    ``kind`` is a :class:`FailureKind`, or ``status_<code>`` (:func:`status_kind`) for an
    HTTP error answer.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.body = body
        self.replica: str | None = None  # which replica failed, for the caller's message

    def blank(self, secrets: Sequence[str]) -> None:
        """Blank ``secrets`` (the upstream keys) in the backend's message and error fields."""
        if not secrets:
            return
        self.message = blank(self.message, secrets)
        if self.body is not None:
            self.body = {
                name: blank(value, secrets) if isinstance(value, str) else value
                for name, value in self.body.items()
            }

    @property
    def counts_against_replica(self) -> bool:
        """Connection failures and 5xx count against a replica's health; 4xx never do, nor
        an answer the gateway cannot pass on (it says nothing of the replica's health)."""
        if self.kind == FailureKind.BAD_ANSWER:
            return False
        return self.status is None or self.status >= 500


@dataclass(slots=True)
class Opened:
    """A successful attempt: the body (non-streaming) or the live response (streaming).

    ``usage``: a non-streaming answer's ``usage`` value as the backend sent it (not checked).
    """

    status: int
    content_type: str
    body: bytes | None
    response: Response | None
    usage: Any = None


def _retry_after(value: str | None) -> float | None:
    """A Retry-After in seconds: finite and not negative (``inf``, ``nan``, a date: ``None``).

    The forwarder clamps it to the replica cool-down cap before any use.
    """
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _upstream_message(raw: bytes, status: int) -> tuple[str, dict[str, Any] | None]:
    """The message of an error body: ``{"error": {...}}`` (vLLM, llama.cpp, Ollama), flat
    (older vLLM, SGLang) or ``{"error": "...", "error_type": ...}`` (TGI)."""
    try:
        data = _decoder.decode(raw)
    except UNREADABLE_JSON:
        return f"The backend answered {status}.", None
    if isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"]:
        return data["error"][:2000], None
    if isinstance(data, dict):
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        message = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(message, str) and message:
            return message[:2000], inner if isinstance(inner, dict) else None
    return f"The backend answered {status}.", None


async def _fail_from_status(response: Response) -> AttemptFailed:
    status = response.status
    try:
        raw = await response.read_at_most(65536)
    finally:
        response.release()
    message, body = _upstream_message(raw, status)
    return AttemptFailed(
        status_kind(status),
        message,
        status=status,
        retry_after=_retry_after(response.header("Retry-After")),
        body=body,
    )


def usage_from(data: Any) -> Usage | None:
    """The ``usage`` of a response or chunk object, if it has one."""
    if not isinstance(data, dict):
        return None
    return usage_fields(data.get("usage"))


def whole_usage(opened: Opened, most: int) -> Usage | None:
    """A whole answer's usage (``usage_fields``). A completion reported as none (0, or no
    number) while the answer holds text (content, thinking, tool calls: ``generated_texts``)
    counts that text roughly instead, at most ``most``
    (what the request was allowed; 0: ``echo`` of a prompt, nothing generated), as a stream
    counts what it relayed: a broken count does not make an answer free."""
    usage = usage_fields(opened.usage)
    if usage is not None and usage.completion_tokens == 0 and most > 0 and opened.body:
        usage.completion_tokens = min(most, answer_text_tokens(opened.body))
    return usage


def answer_text_tokens(body: bytes) -> int:
    """A rough count of what a whole answer's choices generated: a message's ``content``,
    its thinking (``reasoning_content``, or newer vLLM's ``reasoning``) and its tool calls'
    names and arguments, or a completion's ``text``. Decoded only for an answer whose count
    is in doubt."""
    answer = _object_of(body)
    choices = answer.get("choices") if answer is not None else None
    if not isinstance(choices, list):
        return 0
    total = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        texts = generated_texts(message) if isinstance(message, dict) else [choice.get("text")]
        total += sum(text_tokens(text) for text in texts if isinstance(text, str) and text)
    return min(total, MAX_COUNT)


# Where a chat message or delta keeps generated text besides ``content``: the thinking of a
# reasoning model (vLLM's ``--reasoning-parser``: ``reasoning_content``, ``reasoning`` from
# 0.10), and the function of a tool call (``tool_calls[].function``, the older
# ``function_call``).
REASONING_FIELDS: Final = ("reasoning_content", "reasoning")


def generated_texts(message: dict[str, Any]) -> list[Any]:
    """The generated strings of a chat ``message`` (or streamed ``delta``): its content, its
    thinking, and each tool call's name and arguments (values as sent: not checked)."""
    texts = [message.get("content")]
    texts.extend(message.get(field) for field in REASONING_FIELDS)
    calls = message.get("tool_calls")
    functions = [message.get("function_call")]
    if isinstance(calls, list):
        functions.extend(call.get("function") for call in calls if isinstance(call, dict))
    for function in functions:
        if isinstance(function, dict):
            texts.extend((function.get("name"), function.get("arguments")))
    return texts


def usage_fields(usage: Any) -> Usage | None:
    """A ``usage`` object's counts, if it is one."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    completion = _count(usage.get("completion_tokens"))
    prompt = usage.get("prompt_tokens")
    if prompt is None:  # absent: what the total says is left after the completion
        total = _count(usage.get("total_tokens"))
        prompt = total - completion if total > completion else 0
    return Usage(
        prompt_tokens=_count(prompt), completion_tokens=completion, cached_tokens=_count(cached)
    )


# No answer holds more tokens than this; a larger claim (1e26 from a broken backend) would
# overflow the 64-bit limit counters it settles into, so it is clipped here.
MAX_COUNT: Final = 1 << 40
# Decimal digits of a count sent as a string ("300"): at most this many, so int() stays cheap.
_MAX_DIGITS: Final = 13


def _count(value: Any) -> int:
    """A token count from the backend: never below zero (a negative one would refund tokens
    the key never got back and make the token counters go down), never above ``MAX_COUNT``,
    a count sent as a string of decimal digits ("300") read as its number, and 0 for anything
    else that is not a finite number ("many", a list, true, 1e999) rather than an error for
    the caller."""
    if type(value) is int:  # the usual case; bool is not a count
        return (value if value < MAX_COUNT else MAX_COUNT) if value > 0 else 0
    if isinstance(value, float) and math.isfinite(value):
        return min(MAX_COUNT, max(0, int(value)))
    if (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_DIGITS
        and value.isascii()
        and value.isdigit()
    ):
        return min(MAX_COUNT, int(value))
    return 0


def answer_usage(body: bytes) -> Any:
    """The answer's ``usage``, read without building the rest (the value as sent: the proxy
    reads its counts with ``usage_fields``). A 200 that is not JSON (HTML, empty, cut
    short, nested too deep) is a failed attempt, never passed on as a success. A JSON array
    (llama.cpp's answer to a list of prompts on /v1/completions) is an answer without usage."""
    try:
        answer = _answer_decoder.decode(body)
    except msgspec.ValidationError:
        if body.lstrip()[:1] == b"[" and _is_json(body):
            return None
        raise AttemptFailed(
            FailureKind.BAD_ANSWER, "The backend's answer is not a JSON object."
        ) from None
    except UNREADABLE_JSON:
        raise AttemptFailed(FailureKind.BAD_ANSWER, "The backend's answer is not JSON.") from None
    if answer.choices is msgspec.UNSET and (answer.error or answer.object == "error"):
        raise _error_answer(answer, body)
    return answer.usage


def _error_answer(answer: _Answer, body: bytes) -> AttemptFailed:
    """A 200 whose body is an error object and no answer (``{"error": ...}``, or the flat
    ``{"object": "error", ...}``): the failure its ``code`` names (500 without one), handled
    like an HTTP error answer of that status, never passed on as a success."""
    error = answer.error if isinstance(answer.error, dict) else _object_of(body)
    status = error_status(error) if isinstance(error, dict) else 500
    message, detail = _upstream_message(body, status)
    return AttemptFailed(status_kind(status), message, status=status, body=detail)


def error_status(error: dict[str, Any]) -> int:
    """The HTTP status an error object's ``code`` names (500 without one)."""
    code = error.get("code")
    return code if type(code) is int and 400 <= code <= 599 else 500


def _object_of(body: bytes) -> dict[str, Any] | None:
    """``body`` decoded, if it is a JSON object."""
    try:
        data = _decoder.decode(body)
    except UNREADABLE_JSON:
        return None
    return data if isinstance(data, dict) else None


def _without_bom(body: bytes) -> bytes:
    """``body`` without a UTF-8 byte order mark (tolerated before JSON, RFC 8259 8.1)."""
    return body[3:] if body[:3] == _BOM else body


def _is_json(body: bytes) -> bool:
    try:
        _decoder.decode(body)
    except UNREADABLE_JSON:
        return False
    return True


async def attempt(
    pool: UpstreamPool,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    *,
    stream: bool,
    timeout_s: float,
    connect_s: float | None = None,
) -> Opened:
    """POST ``payload`` to ``url``; return when the answer (or the stream's head) is there.

    ``timeout_s`` bounds the whole attempt up to the answer (or the stream's head);
    ``connect_s`` bounds opening the connection alone.
    """
    response: Response | None = None
    try:
        with deadline(timeout_s):
            response = await pool.post(url, payload, headers, connect_s=connect_s)
            if response.status != 200:
                raise await _fail_from_status(response)
            content_type = response.header("Content-Type") or "application/json"
            if stream:
                return Opened(200, content_type, None, response)
            body = _without_bom(await response.read(MAX_ANSWER))
            response.release()
            return Opened(200, content_type, body, None, answer_usage(body))
    except ConnectTimedOut as exc:
        raise AttemptFailed(
            FailureKind.CONNECT_TIMEOUT, "The backend did not accept in time."
        ) from exc
    except TimeoutError as exc:
        if response is not None:
            response.close()
        raise AttemptFailed(FailureKind.TIMEOUT, "The backend did not answer in time.") from exc
    except ConnectFailed as exc:
        raise AttemptFailed(FailureKind.CONNECT, "The backend refused the connection.") from exc
    except ValueError as exc:  # Response.read: above MAX_ANSWER
        if response is not None:
            response.close()
        raise AttemptFailed(
            FailureKind.BAD_ANSWER, "The backend's answer is larger than 32 MiB."
        ) from exc
    except OSError as exc:
        if response is not None:
            response.close()
        raise AttemptFailed(FailureKind.RESET, "The connection to the backend was lost.") from exc
    except asyncio.CancelledError:
        if response is not None:
            response.close()  # closing the connection makes vLLM abort the request
        raise


def choice_text(raw: bytes, part: str) -> str | None:
    """The first choice's answer in JSON from a backend: ``part`` names where a chat answer
    keeps it (``delta`` in a streamed chunk, ``message`` in a whole answer): its ``content``
    (none: empty), then its tool calls as :func:`policies.agreement.tool_call_text` writes them
    (a streamed chunk's pieces, joined, make a whole answer's text); a completion's ``text``
    either way; thinking never. ``None`` when there is none, or the JSON cannot be read."""
    try:
        data = _decoder.decode(raw)
    except UNREADABLE_JSON:
        return None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    holder = choice.get(part)
    if not isinstance(holder, dict):
        text = choice.get("text")
        return text if isinstance(text, str) else None
    content = holder.get("content")
    calls = holder.get("tool_calls")
    answer = content if isinstance(content, str) else ""
    if isinstance(calls, list) and calls:
        answer += "".join(_call_text(call) for call in calls)
    return answer


def _call_text(call: Any) -> str:
    """One tool call of a message, or one streamed piece of it, as answer text."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ""
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(arguments, str):  # an object (Ollama's own API) or nothing yet
        arguments = _encoder.encode(arguments).decode() if arguments is not None else ""
    return tool_call_text(name if isinstance(name, str) else None, arguments)
