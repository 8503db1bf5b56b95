"""``deadline``: asyncio.timeout's behaviour where the request path relies on it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.deadline import deadline


async def test_the_block_ends_in_timeout_error_when_time_runs_out() -> None:
    """A wait past the deadline is cancelled and surfaces as TimeoutError; the task is not
    left cancelling (a later await works)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError), deadline(0.05):
        await asyncio.sleep(5)
    assert loop.time() - started < 1.0
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0)


async def test_a_block_that_finishes_in_time_is_untouched() -> None:
    """The timer is cancelled on exit: nothing fires after the block."""
    with deadline(0.05):
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # would be cancelled here if the timer were still armed
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_errors_inside_the_block_pass_through() -> None:
    """An error other than our cancellation is the caller's error, as it was raised."""
    with pytest.raises(ValueError, match="boom"), deadline(1.0):
        raise ValueError("boom")


async def test_an_outside_cancellation_stays_a_cancellation() -> None:
    """Cancelling the task (the client left) is not turned into TimeoutError."""

    async def waits() -> None:
        with deadline(5.0):
            await asyncio.sleep(5)

    task = asyncio.create_task(waits())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("ours", [True, False])
async def test_an_outside_cancellation_racing_the_deadline_stays_a_cancellation(
    ours: bool,
) -> None:
    """Both fire before the task runs again: the cancellation from elsewhere wins over
    TimeoutError, for ``deadline`` as for asyncio.timeout."""
    outcomes: list[str] = []
    loop = asyncio.get_running_loop()

    async def waits() -> None:
        try:
            if ours:
                with deadline(0.01):
                    loop.call_later(0.01, task.cancel)  # due just after the deadline's timer
                    await asyncio.sleep(0.2)
            else:
                async with asyncio.timeout(0.01):
                    loop.call_later(0.01, task.cancel)
                    await asyncio.sleep(0.2)
        except TimeoutError:
            outcomes.append("timeout")
            raise

    task = asyncio.create_task(waits())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcomes == []


async def test_matches_asyncio_timeout_on_the_same_races() -> None:
    """The same three cases through asyncio.timeout give the same outcomes."""

    async def run(use_ours: bool, wait_s: float, limit_s: float) -> str:
        try:
            if use_ours:
                with deadline(limit_s):
                    await asyncio.sleep(wait_s)
            else:
                async with asyncio.timeout(limit_s):
                    await asyncio.sleep(wait_s)
        except TimeoutError:
            return "timeout"
        return "done"

    for wait_s, limit_s in ((0.2, 0.01), (0.0, 0.2), (0.01, 0.2)):
        assert await run(True, wait_s, limit_s) == await run(False, wait_s, limit_s)


def test_outside_a_task_is_refused() -> None:
    """A deadline needs a task to cancel."""
    with pytest.raises(RuntimeError):
        deadline(1.0).__enter__()


async def test_none_means_no_limit_as_with_asyncio_timeout() -> None:
    """``deadline(None)`` arms no timer; the block runs to its end."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    finished = False
    with deadline(None):
        await asyncio.sleep(0.02)
        finished = True
    assert finished
    assert loop.time() - started >= 0.02
