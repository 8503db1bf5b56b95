"""One streamed request, timed the way ``vllm bench serve`` times it."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadgen.prompts import Prompt
from loadgen.spec import Target

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_ERROR_TEXT_LIMIT = 300


@dataclass(slots=True)
class RequestResult:
    """What one request did. Times are seconds from the moment it was sent."""

    ok: bool = False
    status: str = ""  # "200", "503", "connect", "timeout", "stream_error", "not_a_stream"...
    error: str = ""
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    counted_from: str = "chunks"  # "usage" when the stream's usage chunk gave the count
    sent_at: float = 0.0

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None with fewer than two tokens."""
        if self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """Everything that is the same for every request of one grid point."""

    chat: bool
    max_tokens: int
    ignore_eos: bool
    timeout_s: float


def build_body(target: Target, spec: RequestSpec, prompt: Prompt) -> dict[str, Any]:
    """A streaming request with usage asked for and ``max_tokens`` set."""
    body: dict[str, Any] = {
        "model": target.model,
        "stream": True,
        "max_tokens": spec.max_tokens,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.chat:
        body["messages"] = prompt.chat_messages()
    else:
        body["prompt"] = prompt.text
    return body


def headers(target: Target) -> dict[str, str]:
    """Request headers; the key goes only here."""
    result = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if target.api_key:
        result["Authorization"] = f"Bearer {target.api_key}"
    return result


def redact(text: str, target: Target) -> str:
    """``text`` with the target's key masked (a server might echo it back)."""
    if target.api_key and target.api_key in text:
        return text.replace(target.api_key, "***")
    return text


def error_message(raw: bytes, target: Target) -> str:
    """The ``error.message`` of an OpenAI-shaped body, else the start of the body."""
    text = raw.decode("utf-8", "replace")
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    return redact(str(message).strip()[:_ERROR_TEXT_LIMIT], target)


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        # Generated text of any kind: the answer, a reasoning model's thinking (vLLM:
        # ``reasoning_content``, ``reasoning`` from 0.10), a tool call's name or arguments.
        for text in (delta.get(field) for field in ("content", "reasoning_content", "reasoning")):
            if text:
                return str(text)
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and (function.get("name") or function.get("arguments")):
                return str(function.get("name") or function.get("arguments"))
        return ""
    return str(choice.get("text") or "")


def _on_event(result: RequestResult, data: bytes, now: float, last: float) -> float:
    """Account one SSE ``data:`` payload; returns the time of the last token seen."""
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        return last
    if "error" in chunk:
        result.status = "stream_error"
        result.error = str((chunk["error"] or {}).get("message", ""))[:_ERROR_TEXT_LIMIT]
        return last
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        result.output_tokens = int(usage["completion_tokens"])
        result.counted_from = "usage"
        if usage.get("prompt_tokens") is not None:
            result.prompt_tokens = int(usage["prompt_tokens"])
    if not _chunk_text(chunk):
        return last
    if result.ttft == 0.0:
        result.ttft = now
    else:
        result.itl.append(now - last)
    if result.counted_from == "chunks":
        result.output_tokens += 1
    return now


async def _read_stream(
    response: aiohttp.ClientResponse, result: RequestResult, start: float
) -> None:
    last = 0.0
    done = False
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        now = time.perf_counter() - start
        try:
            last = _on_event(result, data, now, last)
        except ValueError:
            result.status, result.error = "stream_error", "a stream event is not JSON"
        if result.status == "stream_error":
            return
    result.e2el = time.perf_counter() - start
    if result.ttft == 0.0:
        result.status, result.error = "no_tokens", "the stream carried no tokens"
    elif not done:
        result.status, result.error = "stream_error", "the stream ended without [DONE]"
    else:
        result.ok = True


async def send(
    session: aiohttp.ClientSession,
    target: Target,
    spec: RequestSpec,
    body: dict[str, Any],
    *,
    origin: float,
) -> RequestResult:
    """Send one request; every failure is recorded in the result, never raised."""
    result = RequestResult()
    path = CHAT_PATH if spec.chat else COMPLETIONS_PATH
    start = time.perf_counter()
    result.sent_at = start - origin
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    try:
        async with session.post(
            target.endpoint(path), json=body, headers=headers(target), timeout=timeout
        ) as response:
            result.status = str(response.status)
            if response.status != 200:
                result.error = error_message(await response.read(), target)
                result.e2el = time.perf_counter() - start
                return result
            if response.content_type != "text/event-stream":
                result.status = "not_a_stream"
                result.error = (
                    f"the server answered {response.content_type}, not an event "
                    "stream (does it support stream: true?)"
                )
                return result
            await _read_stream(response, result, start)
    except TimeoutError:
        result.status, result.error = "timeout", f"no complete answer in {spec.timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        result.status, result.error = "connect", f"cannot connect: {exc.os_error}"
    except (aiohttp.ClientError, asyncio.IncompleteReadError, OSError) as exc:
        result.status, result.error = "connection", f"{type(exc).__name__}: {exc}"
    except ValueError as exc:  # aiohttp's "Line is too long", an undecodable payload
        result.status, result.error = "stream_error", f"unreadable stream: {exc}"
    if not result.ok and result.e2el == 0.0:
        result.e2el = time.perf_counter() - start
    result.error = redact(result.error, target)  # whatever the server said, never the key
    return result
