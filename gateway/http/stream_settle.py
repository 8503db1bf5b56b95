"""Settling a stream's admission before the caller sees its end (``Admission.settle_first``).

An admission that holds a concurrency slot (or a budget whose header shows the settled spend)
is settled before the stream's last chunk reaches the caller: before the chunk with ``[DONE]``
(its usage is known by then, the relay still open), else once the relay has closed and counted
what was streamed. The iterated relay (the Litestar path) wraps its chunks in
:func:`settled_before_end`; the pump (the native path) settles itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.upstream.relay import StreamRelay


async def settled_before_end(
    stream: AsyncIterator[bytes],
    relay: StreamRelay,
    settle: Callable[[], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The relay's chunks, with the request settled before the stream ends: before the chunk
    with ``[DONE]``, else before the end of the body. The concurrency slot is free before the
    caller can see the stream end."""
    settled = False
    try:
        async for chunk in stream:
            if relay.done and not settled:
                settled = True
                await settle()
            yield chunk
        if not settled:
            settled = True
            await settle()
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator
