"""gateway.pipeline.eager: a coroutine started at once and finished in the caller's task."""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.eager import eager


async def test_it_runs_at_once_until_it_waits_then_finishes_when_awaited() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    steps: list[str] = []

    async def work() -> int:
        steps.append("sent")
        value = await answer
        steps.append("answered")
        return value * 2

    started = eager(work())
    assert steps == ["sent"]  # no pass of the loop was needed to get here
    loop.call_later(0.01, answer.set_result, 21)
    assert await started == 42
    assert steps == ["sent", "answered"]


async def test_a_reply_already_in_is_taken_without_a_pass_of_the_loop() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    async def work() -> str:
        return await answer

    started = eager(work())
    answer.set_result("ready")
    passes: list[int] = []
    loop.call_soon(passes.append, 1)
    assert await started == "ready"
    assert passes == []  # the awaiting task never went back to the loop


async def test_a_coroutine_that_never_waits_gives_its_value_even_none() -> None:
    async def value() -> int:
        return 7

    async def nothing() -> int | None:
        return None

    assert await eager(value()) == 7
    assert await eager(nothing()) is None


async def test_an_error_before_the_first_wait_is_raised_by_the_await() -> None:
    async def refuses() -> int:
        raise LookupError("no")

    started = eager(refuses())  # nothing raised yet, as with a task
    with pytest.raises(LookupError, match="no"):
        await started


async def test_an_error_of_what_it_waits_for_is_raised_inside_it() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def work() -> int:
        try:
            return await answer
        except ConnectionError as exc:
            seen.append(str(exc))
            raise

    started = eager(work())
    loop.call_soon(answer.set_exception, ConnectionError("lost"))
    with pytest.raises(ConnectionError):
        await started
    assert seen == ["lost"]


async def test_cancelling_the_caller_cancels_the_coroutine_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    cleaned: list[str] = []

    async def work() -> int:
        try:
            return await answer
        except asyncio.CancelledError:
            cleaned.append("freed its slot")
            raise

    async def caller() -> int:
        return await eager(work())

    task = loop.create_task(caller())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["freed its slot"]
    assert answer.cancelled()


async def test_bare_yields_and_several_waits_are_driven_like_a_task() -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[int] = loop.create_future()
    second: asyncio.Future[int] = loop.create_future()

    async def work() -> int:
        await asyncio.sleep(0)
        a = await first
        await asyncio.sleep(0)
        return a + await second

    started = eager(work())
    loop.call_soon(first.set_result, 1)
    loop.call_later(0.01, second.set_result, 2)
    assert await started == 3


async def test_it_can_be_awaited_once() -> None:
    async def value() -> int:
        return 1

    started = eager(value())
    await started
    with pytest.raises(RuntimeError, match="awaited twice"):
        await started


async def test_a_cancellation_before_the_first_wait_is_kept_for_the_await() -> None:
    async def cancelled_at_once() -> int:
        raise asyncio.CancelledError

    started = eager(cancelled_at_once())  # kept, as a task keeps it
    with pytest.raises(asyncio.CancelledError):
        await started
