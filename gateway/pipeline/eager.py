"""Start a coroutine now, finish it later, in the caller's own task.

``started = eager(coro)`` runs ``coro`` at once, up to its first suspension (for the limiter:
until its Redis command is written), and ``await started`` runs the rest inline, as
``await coro`` would have. Between the two the caller does other work (classification) while
the command is in flight. It is what Python 3.12's eager tasks give, without a task: no task
object, no pass of the event loop to start it, none to hand its result back (two passes of
about 10 µs each on the request path). The coroutine's steps are driven exactly as a task
drives them (``send`` on wake-up, ``throw`` on an error or a cancellation), so a cancelled
caller cancels the coroutine at the point where it waits.

An exception (or a cancellation) raised before the first suspension is kept and raised by
``await``, as a task would keep it; ``KeyboardInterrupt`` and ``SystemExit`` propagate at
once, as from a task's step. Awaiting twice is an error; never awaiting leaves the coroutine
to be closed when collected (its ``finally`` blocks run then), so a caller that gives up must
still await it (see ``gateway.http.settlement.withdraw``).
"""

from __future__ import annotations

from asyncio import CancelledError, isfuture
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_DONE = object()


class Eager(Generic[T]):
    """A coroutine already started; await it (once) for its result."""

    __slots__ = ("_coro", "_error", "_value", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro: Coroutine[Any, Any, T] | None = coro
        self._error: BaseException | None = None
        self._value: Any = _DONE
        self._yielded: Any = None
        try:
            self._yielded = coro.send(None)
        except StopIteration as done:
            self._coro, self._value = None, done.value
        except (Exception, CancelledError) as exc:  # noqa: BLE001  # kept for the await, as a task keeps it
            self._coro, self._error = None, exc

    def __await__(self) -> Generator[Any, None, T]:
        coro = self._coro
        if coro is None:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._value is _DONE:
                raise RuntimeError("an eagerly started coroutine was awaited twice")
            value, self._value = self._value, _DONE
            return value  # type: ignore[no-any-return]  # what the coroutine returned
        self._coro = None
        yielded = self._yielded
        while True:
            if isfuture(yielded) and yielded.done():
                # Already answered (the reply came in while the caller worked): resume now,
                # not after a pass of the loop. The flag is the task protocol's, reset as a
                # task would on taking the future.
                yielded._asyncio_future_blocking = False
                try:
                    yielded = coro.send(None)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]  # what the coroutine returned
                continue
            try:
                yield yielded  # to our task, as the coroutine yielded it (a future, or None)
            except BaseException as exc:  # noqa: BLE001  # handed to the coroutine, as a task would
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]  # as above
            else:
                try:
                    yielded = coro.send(None)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]  # as above


def eager(coro: Coroutine[Any, Any, T]) -> Eager[T]:
    """Run ``coro`` until it first waits; await the result for the rest."""
    return Eager(coro)
