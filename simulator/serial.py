"""One generation at a time, as llama-cpp-python's server runs (``--serial``).

That server guards its model with two locks: a request takes the outer one while it waits
for the inner one, which the running generation holds; ``/v1/models`` waits the same way. With
``--interrupt_requests`` (on by default there) a running stream checks after every chunk
whether anyone holds the outer lock, and if so ends itself with ``data: [DONE]`` — no final
chunk, no ``finish_reason`` — so the waiting request can start. A gateway that probes
``/v1/models`` while a stream runs cuts that stream short; this module reproduces it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

SerialMode = Literal["off", "wait", "interrupt"]
SERIAL_MODES: tuple[str, ...] = ("off", "wait", "interrupt")


class SerialModel:
    """The model lock of a one-at-a-time server; ``mode`` off makes it a no-op."""

    def __init__(self, mode: str = "off") -> None:
        self.mode = mode
        self._lock = asyncio.Lock()
        self.waiting = 0  # requests waiting for the running generation to end
        self.interrupted = 0  # streams ended early because a request waited

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the model for one request (waiting behind the running one)."""
        if self.mode == "off":
            yield
            return
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def should_interrupt(self) -> bool:
        """A running stream's check after each chunk: end now, someone waits."""
        if self.mode == "interrupt" and self.waiting > 0:
            self.interrupted += 1
            return True
        return False
