"""A reply's after-work runs once the answer is out; its failure is logged, never raised into
the connection (nothing is left to answer)."""

from __future__ import annotations

from structlog.testing import capture_logs

from gateway.access.passthrough import _UNLIMITED as OPEN
from gateway.http.edge import run_after_work
from gateway.limits.limits import _UNLIMITED, KeyAdmission


async def test_a_failing_finish_is_logged_not_raised() -> None:
    """The sync step (recording the request) fails: logged as request.after_failed."""

    def finish() -> None:
        raise RuntimeError("boom")

    with capture_logs() as logs:
        await run_after_work(finish, None)
    assert [line["event"] for line in logs] == ["request.after_failed"]


async def test_a_failing_after_is_logged_not_raised() -> None:
    """The async step (settling the limits) fails: logged the same way."""

    async def after() -> None:
        raise RuntimeError("boom")

    with capture_logs() as logs:
        await run_after_work(None, after)
    assert [line["event"] for line in logs] == ["request.after_failed"]


async def test_a_finish_runs_once_and_a_failing_one_never_stops_the_after() -> None:
    """Nothing is lost: each step runs exactly once, and ``after`` runs even when ``finish``
    failed (the same policy on the native and the Litestar path)."""
    calls: list[str] = []

    def finish() -> None:
        calls.append("finish")
        raise RuntimeError("boom")

    async def after() -> None:
        calls.append("after")

    with capture_logs():
        await run_after_work(finish, after)
    assert calls == ["finish", "after"]


def test_only_admissions_that_reserved_nothing_skip_their_settlement() -> None:
    """No limits (or limiting switched off): nothing to settle; a key's reservation: settled."""
    assert _UNLIMITED.settles is False
    assert OPEN.settles is False
    assert KeyAdmission.settles is True
