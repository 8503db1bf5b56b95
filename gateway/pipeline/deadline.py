"""A cheaper ``asyncio.timeout`` for the request path's hottest waits.

``asyncio.timeout`` is an async context manager with a state machine and a reschedulable
handle; on the request path it cost about 7 µs per use here, against about 3 µs for one
``call_later`` and its ``cancel``. ``deadline`` keeps its semantics for the one thing the
request path does with it (a fixed delay around one await chain): when the delay passes, the
current task is cancelled, and that cancellation, if it is the one that ends the block, comes
out as ``TimeoutError``; a cancellation from elsewhere (the client leaving) stays a
cancellation. Only for use inside a task.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class deadline:  # noqa: N801  # used like asyncio.timeout, a context manager named as a verb
    """``with deadline(seconds):`` inside a task; ``TimeoutError`` when the time runs out
    (``None``: no limit)."""

    __slots__ = ("_cancelling", "_delay", "_expired", "_handle", "_task")

    def __init__(self, seconds: float | None) -> None:
        self._delay = seconds  # None: no limit (as asyncio.timeout(None))
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._delay is not None:
            self._handle = task.get_loop().call_later(self._delay, self._expire)

    def _expire(self) -> None:
        self._task.cancel()
        self._expired = True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
        # As asyncio.timeout: our cancellation is taken back whatever ended the block, and it
        # becomes TimeoutError only when it is what ended it and no other one is pending.
        if (
            self._expired
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc
