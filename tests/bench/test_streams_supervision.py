"""The streams report's supervisor lines: worker restarts and stall kills read from a log."""

from __future__ import annotations

from pathlib import Path

from bench.streams.supervision import supervision_lines, supervision_note

LOG = "\n".join(
    [
        '{"event": "server.started", "workers": 2, "level": "info"}',
        '{"event": "server.worker_stalled", "worker": 1, "silent_s": 10.2, "level": "error"}',
        '{"event": "server.worker_exited", "worker": 1, "code": -9, "level": "warning"}',
        '{"event": "request.completed", "status": 200, "level": "info"}',
        "2026-12-07 09:00:00 [warning  ] server.worker_exited  code=-9 worker=0",
    ]
)


def test_lines_are_counted_per_event() -> None:
    """Each supervision event's lines are found, in JSON and console format; others ignored."""
    found = supervision_lines(LOG)
    assert [len(found[e]) for e in found] == [1, 2, 0]
    assert '"silent_s": 10.2' in found["server.worker_stalled"][0]


def test_note_counts_and_quotes_the_first(tmp_path: Path) -> None:
    """The note gives every event's count (zeros included) and quotes the first line of each."""
    log = tmp_path / "tiergate.log"
    log.write_text(LOG)
    note = supervision_note("TierGate (plain), 2 workers", log)
    assert "`server.worker_stalled` 1, `server.worker_exited` 2, `server.workers_failing` 0" in note
    assert 'First `server.worker_exited`: `{"event": "server.worker_exited", "worker": 1' in note
    assert "First `server.workers_failing`" not in note


def test_a_clean_log_says_zero(tmp_path: Path) -> None:
    """A run without a restart or kill says so with zeros, not silence."""
    log = tmp_path / "tiergate.log"
    log.write_text('{"event": "server.started"}\n')
    note = supervision_note("leg", log)
    assert note.endswith("`server.workers_failing` 0.")
    assert "First" not in note


def test_a_missing_log_is_reported(tmp_path: Path) -> None:
    """A log that cannot be read is named in the note instead of failing the run's report."""
    note = supervision_note("leg", tmp_path / "absent.log")
    assert "absent.log not read" in note
