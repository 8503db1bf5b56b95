"""The streams report's supervisor checks: worker restarts and stall kills read from the
gateway's log, and the longest silence of each worker's heartbeat file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.streams.supervision import (
    HeartbeatWatch,
    heartbeat_note,
    share_dir_of,
    supervision_lines,
    supervision_note,
)
from tests.processes import patience

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


def test_share_dir_is_read_from_a_child_of_the_supervisor(tmp_path: Path) -> None:
    """The group directory is the ``--share-dir`` of a process whose parent is the supervisor
    (here this test, with one real child); a process with no such child has none."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "--share-dir", str(tmp_path)],
        stdin=subprocess.PIPE,
    )
    try:
        assert share_dir_of(os.getpid()) == tmp_path
        assert share_dir_of(child.pid) is None
    finally:
        child.communicate(b"")


def test_watch_keeps_each_files_longest_silence(tmp_path: Path) -> None:
    """A file rewritten every second shows ~1 s; one left alone for 4.2 s shows 4.2 s; the
    silence restarts at each change."""
    beating, stalled = tmp_path / "metrics-0.prom", tmp_path / "metrics-1.prom"
    beating.write_text("0")
    stalled.write_text("0")
    watch = HeartbeatWatch(tmp_path)
    for tick in range(43):  # 4.2 s at 0.1 s
        now = tick / 10
        if tick % 10 == 0:
            os.utime(beating, ns=(tick * 10**8, tick * 10**8))
        watch.sample(now)
    os.utime(stalled, ns=(1, 1))  # it beats again: its silence so far stays the longest
    watch.sample(4.3)
    assert watch.longest_s["metrics-0.prom"] == pytest.approx(0.9)
    assert watch.longest_s["metrics-1.prom"] == pytest.approx(4.2)


def test_watch_runs_on_its_thread_until_stopped(tmp_path: Path) -> None:
    """Started, it samples by itself; stopped, it returns every file's longest silence."""
    (tmp_path / "metrics-0.prom").write_text("0")
    watch = HeartbeatWatch(tmp_path, every_s=0.01).start()
    deadline = time.monotonic() + patience(5)
    while "metrics-0.prom" not in watch.longest_s:
        assert time.monotonic() < deadline, "the watch never sampled"
        time.sleep(0.01)
    assert list(watch.stop()) == ["metrics-0.prom"]


def test_heartbeat_note_names_the_limit() -> None:
    """The note gives each worker's longest silence and the watchdog's limit; no files: says so."""
    note = heartbeat_note("leg", {"metrics-0.prom": 1.04, "metrics-1.prom": 2.26}, 10.0)
    assert "metrics-0.prom 1.0 s, metrics-1.prom 2.3 s" in note
    assert note.endswith("kills a worker at 10 s.")
    assert "no worker heartbeat files" in heartbeat_note("leg", {}, 10.0)
