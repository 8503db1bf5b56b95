"""The completion endpoints: faults, planning, admission, then a unary or streamed reply."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from typing import NoReturn

from aiohttp import web

from simulator.engine import QueueFullError, Sequence
from simulator.planner import Plan
from simulator.responses import completion_body
from simulator.schemas import SimError
from simulator.sse import DONE, ChunkEncoder, error_event
from simulator.state import SimState

JSON = "application/json"
_FAULT_STATUS = {
    "fail_429": 429,
    "fail_400": 400,
    "fail_404": 404,
    "fail_500": 500,
    "fail_503": 503,
}
_LINGER_RESET = struct.pack("ii", 1, 0)
_DISCONNECT_GRACE_S = 10.0


def base_headers(request: web.Request, state: SimState) -> dict[str, str]:
    """``x-request-id`` (echoed or generated) and ``x-sim-replica``."""
    request_id = request.headers.get("X-Request-Id") or os.urandom(16).hex()
    return {"x-request-id": request_id, "x-sim-replica": state.replica}


def error_response(
    error: SimError, headers: dict[str, str], state: SimState | None = None
) -> web.Response:
    """An error response, in the shape of the simulated server (vLLM's by default)."""
    if state is None:
        return web.Response(
            body=error.body(), status=error.status, content_type=JSON, headers=headers
        )
    flavor = state.flavor
    status = flavor.status(error.status)
    return web.Response(
        body=flavor.error_body(status, error.message, error.param),
        status=status,
        content_type=JSON,
        headers=headers,
    )


async def _wait_for_disconnect() -> None:
    """Park the handler until aiohttp cancels it for a connection that is closing.

    With ``handler_cancellation`` the cancellation arrives as soon as the transport reports
    the loss; the bounded sleep is only a fallback.
    """
    await asyncio.sleep(_DISCONNECT_GRACE_S)


async def _hang_up(request: web.Request, *, reset: bool) -> NoReturn:
    """Close the connection without a (complete) response; with ``reset`` send a TCP RST."""
    transport = request.transport
    if transport is not None and reset:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        transport.abort()
    elif transport is not None:
        transport.close()
    await _wait_for_disconnect()
    raise ConnectionResetError("connection closed by fault injection")


async def _pre_response_fault(
    request: web.Request, state: SimState, headers: dict[str, str]
) -> web.Response | None:
    faults = state.faults
    stall = faults.stall_first_byte()
    fault = faults.pre_response()
    if stall:
        await asyncio.sleep(stall)
    if fault is None:
        return None
    if fault in ("fail_refuse", "fail_reset"):
        await _hang_up(request, reset=fault == "fail_reset")
    status = _FAULT_STATUS[fault]
    body = state.flavor.error_body(status, f"Simulated {status} error (fault injection).")
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)


def _cached(state: SimState, seq: Sequence) -> int | None:
    """Cached prompt tokens as vLLM reports them: with the flag on, and only when some were."""
    if state.config.prompt_tokens_details and seq.cached_tokens:
        return seq.cached_tokens
    return None


def _engine_request_id(state: SimState, request_id: str) -> str | None:
    """The engine's id for a request, or ``None`` when vLLM 0.11 would refuse it.

    vLLM uses the caller's ``X-Request-Id`` as the engine request id. 0.11 refuses a second
    request with an id already running ("Request id ... already running."); newer releases
    add a random suffix to every id, so duplicates are accepted.
    """
    if state.config.vllm_version != "0.11":
        return f"{request_id}-{os.urandom(4).hex()}"
    if request_id in state.running_ids:
        return None
    return request_id


async def _duplicate_id(
    request: web.Request, plan: Plan, engine_id: str, headers: dict[str, str]
) -> web.StreamResponse:
    """vLLM 0.11's answer to a duplicate id: 400, or on a stream an error event + [DONE]."""
    message = f"Request id {engine_id} already running."
    if not plan.stream:
        return error_response(SimError(400, message), headers)
    response = web.StreamResponse(headers=headers)
    response.content_type = "text/event-stream"
    await response.prepare(request)
    await response.write(error_event(400, message) + DONE)
    await response.write_eof()
    return response


async def handle_completion(
    request: web.Request, state: SimState, *, chat: bool
) -> web.StreamResponse:
    """Serve one chat or text completion request."""
    state.requests_total += 1
    headers = base_headers(request, state)
    state.last_traceparent = request.headers.get("traceparent")
    state.last_request_id = request.headers.get("X-Request-Id")
    body = await request.read()
    state.last_body = body
    if state.flavor.refuses_request_id(request.headers.get("X-Request-Id")):
        return error_response(SimError(400, "Invalid X-Request-ID: not a UUID."), headers, state)
    if state.faults.active:
        faulted = await _pre_response_fault(request, state, headers)
        if faulted is not None:
            return faulted
    try:
        plan = state.planner.plan(body, chat=chat)
    except SimError as error:
        return error_response(error, headers, state)
    prefix = "chatcmpl-" if chat else "cmpl-"
    engine_id = _engine_request_id(state, prefix + headers["x-request-id"])
    if engine_id is None:
        return await _duplicate_id(request, plan, prefix + headers["x-request-id"], headers)
    state.running_ids.add(engine_id)
    try:
        async with state.serial.hold():
            return await _run(request, state, plan, headers)
    finally:
        state.running_ids.discard(engine_id)


async def _run(
    request: web.Request, state: SimState, plan: Plan, headers: dict[str, str]
) -> web.StreamResponse:
    engine = state.engine
    seq = Sequence(plan.prompt_tokens, plan.output_tokens, plan.chain_seed, plan.total_blocks)
    if engine.config.deferred_s:
        await _deferred(state)
    try:
        started = engine.submit(seq)
    except QueueFullError:
        bound = engine.config.max_queue
        status = state.config.queue_full_status
        message = f"The engine's waiting queue is full ({bound} requests); retry later."
        return error_response(SimError(status, message), headers, state)
    try:
        if plan.stream:
            return await _stream(request, state, plan, seq, headers, started=started)
        return await _unary(state, plan, seq, headers, started=started)
    except ConnectionResetError:
        # A write found the client gone; aiohttp cancels this handler once it sees the loss,
        # which keeps the disconnect out of its error log.
        engine.abort(seq)
        await _wait_for_disconnect()
        raise
    finally:
        engine.abort(seq)  # no-op when the sequence already finished


async def _deferred(state: SimState) -> None:
    """Held back before scheduling (vLLM: a grammar compiling, KV arriving from elsewhere)."""
    engine = state.engine
    engine.deferred += 1
    try:
        await asyncio.sleep(engine.config.deferred_s)
    finally:
        engine.deferred -= 1


async def _unary(
    state: SimState, plan: Plan, seq: Sequence, headers: dict[str, str], *, started: bool
) -> web.Response:
    engine = state.engine
    if not started:
        await engine.wait_started(seq)
    delay = engine.prefill_delay(seq)
    if delay:
        await asyncio.sleep(delay)
    engine.first_token(seq)
    rest = len(plan.output_tokens) - 1
    if rest > 0:
        delay = engine.decode_delay(rest)
        if delay:
            await asyncio.sleep(delay)
        engine.tokens(seq, rest, delay / rest)
    engine.finish(seq, plan.finish_reason)
    prefix = "chatcmpl-" if plan.chat else "cmpl-"
    thinking = _thinking(state, plan)
    thought = (_thought_field(state), "".join(plan.pieces[:thinking])) if thinking else None
    body = completion_body(
        prefix + headers["x-request-id"],
        int(time.time()),
        state.model,
        chat=plan.chat,
        text="".join(plan.pieces[thinking:]),
        finish_reason=plan.finish_reason,
        prompt=len(plan.prompt_tokens),
        completion=len(plan.output_tokens),
        cached=_cached(state, seq),
        thought=thought,
    )
    return web.Response(body=body, content_type=JSON, headers=headers)


async def _stream(
    request: web.Request,
    state: SimState,
    plan: Plan,
    seq: Sequence,
    headers: dict[str, str],
    *,
    started: bool,
) -> web.StreamResponse:
    engine = state.engine
    response = web.StreamResponse(headers=headers)
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    await response.prepare(request)
    if not started:
        await engine.wait_started(seq)
    delay = engine.prefill_delay(seq)
    if delay:
        await asyncio.sleep(delay)
    engine.first_token(seq)
    prefix = "chatcmpl-" if plan.chat else "cmpl-"
    chunks = _chunk_encoder(state, plan, prefix + headers["x-request-id"])
    out: list[bytes] = [chunks.role()] if plan.chat else []
    fault = state.faults.mid_stream()
    fault_at = len(plan.pieces) // 2
    last = len(plan.pieces) - 1
    loop = asyncio.get_running_loop()
    due = loop.time()  # steps keep the engine's clock: a late wake-up stretches no later gap
    for index, piece in enumerate(plan.pieces):
        if index:
            delay = engine.decode_delay()
            if delay:
                await _flush(response, out)
                due += delay
                await asyncio.sleep(max(0.0, due - loop.time()))
            engine.tokens(seq, 1, delay)
        out.append(chunks.token(piece, plan.finish_reason if index == last else None))
        if index != last and state.serial.should_interrupt():
            out.append(DONE)  # llama-cpp-python's interrupt: [DONE], no finish_reason
            await _flush(response, out)
            await response.write_eof()
            return response
        if fault is not None and index == fault_at:
            await _flush(response, out)
            if await _mid_stream_fault(request, state, response, fault):
                return response
            fault = None
    if not plan.pieces:
        out.append(chunks.token("", plan.finish_reason))
    engine.finish(seq, plan.finish_reason)
    if plan.include_usage and state.flavor.stream_usage:
        out.append(
            chunks.usage(len(plan.prompt_tokens), len(plan.output_tokens), _cached(state, seq))
        )
    out.append(DONE)
    await _flush(response, out)
    await response.write_eof()
    return response


def _chunk_encoder(state: SimState, plan: Plan, response_id: str) -> ChunkEncoder:
    """The stream's chunk encoder; a reasoning model's first tokens are thinking."""
    chunks = ChunkEncoder(response_id, int(time.time()), state.model, chat=plan.chat)
    chunks.think(_thinking(state, plan), _thought_field(state))
    return chunks


def _thinking(state: SimState, plan: Plan) -> int:
    """How many of the answer's first tokens are thinking (chat answers only)."""
    return min(state.config.reasoning_tokens, len(plan.pieces)) if plan.chat else 0


def _thought_field(state: SimState) -> str:
    """Where vLLM's reasoning parser puts thinking: ``reasoning_content`` up to 0.11
    (deprecated later), ``reasoning`` in current releases."""
    return "reasoning_content" if state.config.vllm_version == "0.11" else "reasoning"


async def _flush(response: web.StreamResponse, out: list[bytes]) -> None:
    if out:
        data = b"".join(out)
        out.clear()
        await response.write(data)


async def _mid_stream_fault(
    request: web.Request, state: SimState, response: web.StreamResponse, fault: str
) -> bool:
    """Inject ``fault`` into a running stream; True when the stream is over."""
    if fault == "stall_mid_stream":
        await asyncio.sleep(state.faults.rates.stall_seconds)
        return False
    if fault == "drop_mid_stream":
        await _hang_up(request, reset=False)
    # vLLM ends every stream with [DONE], even one that failed (both 0.11 and current).
    await response.write(
        error_event(500, "Simulated engine error mid-stream (fault injection).") + DONE
    )
    await response.write_eof()
    return True
