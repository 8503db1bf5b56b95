"""Stopping background tasks for certain.

``task.cancel()`` asks once, and on Python 3.11 the request can be lost: ``asyncio.wait_for``,
which redis-py (8.1) puts around every command's send on a client with a socket timeout (its
default is 5 s; reads use ``asyncio.timeout``, which keeps it), drops a cancellation that
arrives in the loop pass where the wrapped send finishes (CPython gh-86296; 3.12 rebuilt
``wait_for`` on ``asyncio.timeout``). A send on a live connection finishes at once, so a
cancellation that comes just after a command started is lost every time. A loop that polls
Redis then runs on, and a shutdown that awaits it waits forever. :func:`stop_tasks` asks again
until every task has ended, and gives up after a bound with a log line, so a shutdown always
finishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

_log = structlog.get_logger("tiergate.tasks")

_AGAIN_S = 0.05  # between asks: a swallowed cancellation costs one poll of the loop at most


async def stop_tasks(*tasks: asyncio.Task[Any] | None, within_s: float = 5.0) -> bool:
    """Cancel ``tasks`` (``None`` is skipped) and wait until each has ended, asking again
    every 50 ms; ``False`` (and a warning) if some still run after ``within_s``. A task that
    ended with an error is logged, not raised: a shutdown goes on with its other steps. If the
    caller is cancelled meanwhile, it is cancelled at once and the asking carries on, to the
    same bound, as loop timer callbacks (which a loop shutting down does not cancel, as it
    cancels tasks)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    running: set[asyncio.Task[Any]] = {task for task in tasks if task is not None}
    try:
        while asked := _ask(loop, running, end):
            running = asked
            await asyncio.wait(running, timeout=min(_AGAIN_S, end - loop.time()))
    except asyncio.CancelledError:
        # The caller was cancelled: that goes on at once, and the asking goes on without it
        # (to the same bound), so the tasks still end. Not in a task: asyncio.run's shutdown
        # cancels every task once, and a task cancelled before its first step never asks.
        loop.call_soon(_ask_again, loop, frozenset(running), end)
        raise
    if asked is None:
        return False
    _log_failures(tasks)
    return True


def _ask(
    loop: asyncio.AbstractEventLoop, tasks: Iterable[asyncio.Task[Any]], end: float
) -> set[asyncio.Task[Any]] | None:
    """The tasks of ``tasks`` still running, each asked (again) to cancel; ``None``, with a
    warning, if some still run at ``end``."""
    running = {task for task in tasks if not task.done()}
    if running and end - loop.time() <= 0:
        _log.warning("task.stop_timed_out", tasks=sorted(t.get_name() for t in running))
        return None
    for task in running:
        task.cancel()
    return running


def _ask_again(
    loop: asyncio.AbstractEventLoop, tasks: frozenset[asyncio.Task[Any]], end: float
) -> None:
    """:func:`stop_tasks`' asking for a caller that was cancelled, as timer callbacks."""
    running = _ask(loop, tasks, end)
    if running is None:
        return
    if not running:
        _log_failures(tasks)
        return
    loop.call_later(min(_AGAIN_S, end - loop.time()), _ask_again, loop, tasks, end)


def _log_failures(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    for ended in tasks:
        if ended is not None and not ended.cancelled():
            error = ended.exception()
            if error is not None:
                _log.warning("task.failed", task=ended.get_name(), error=type(error).__name__)
