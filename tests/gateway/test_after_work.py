"""A reply's after-work runs once the answer is out; its failure is logged, never raised into
the connection (nothing is left to answer)."""

from __future__ import annotations

from structlog.testing import capture_logs

from gateway.access.passthrough import _UNLIMITED as OPEN
from gateway.http.native import _run_after, _run_finish
from gateway.limits.limits import _UNLIMITED, KeyAdmission


def test_a_failing_finish_is_logged_not_raised() -> None:
    """The sync step (recording the request) fails: logged as request.after_failed."""

    def finish() -> None:
        raise RuntimeError("boom")

    with capture_logs() as logs:
        _run_finish(finish)
    assert [line["event"] for line in logs] == ["request.after_failed"]


async def test_a_failing_after_is_logged_not_raised() -> None:
    """The async step (settling the limits) fails: logged the same way."""

    async def after() -> None:
        raise RuntimeError("boom")

    with capture_logs() as logs:
        await _run_after(after)
    assert [line["event"] for line in logs] == ["request.after_failed"]


def test_a_finish_runs_once() -> None:
    """Nothing is lost: the step runs, exactly once."""
    calls: list[int] = []
    _run_finish(lambda: calls.append(1))
    assert calls == [1]


def test_only_admissions_that_reserved_nothing_skip_their_settlement() -> None:
    """No limits (or limiting switched off): nothing to settle; a key's reservation: settled."""
    assert _UNLIMITED.settles is False
    assert OPEN.settles is False
    assert KeyAdmission.settles is True
