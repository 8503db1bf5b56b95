"""How many workers ``tiergate serve`` runs: cores, cgroup quota, and the memory limiter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.config.settings import Settings
from gateway.http.workers import Supervisor, WorkersRefused, resolve_workers, usable_cores
from tests.processes import patience


def _settings(
    backend: str = "memory", *, auth: bool = True, divide: bool = False, workers: int | None = None
) -> Settings:
    return Settings.model_validate(
        {
            "auth": {"enabled": auth},
            "ratelimit": {"backend": backend, "memory_divide_per_worker": divide},
            "server": {"workers": workers},
        }
    )


def test_default_is_the_cores_with_redis_limits() -> None:
    """No count given and shared limits: one worker per usable core."""
    assert resolve_workers(_settings("redis"), None, cores=8).count == 8


def test_default_with_memory_limits_is_one_worker_and_says_why() -> None:
    """The default config (memory limiter) starts as one worker; the line saying why is
    logged when asked (once logging is configured), not while the count is decided."""
    with capture_logs() as logs:
        workers = resolve_workers(_settings(), None, cores=8)
    assert workers.count == 1
    assert logs == []
    with capture_logs() as logs:
        workers.log()
    assert [line["event"] for line in logs] == ["server.workers_defaulted"]
    assert logs[0]["workers"] == 1
    assert logs[0]["cores"] == 8


def test_a_count_not_lowered_logs_nothing() -> None:
    """One worker per core, or a count asked for, needs no explanation."""
    with capture_logs() as logs:
        resolve_workers(_settings("redis"), None, cores=8).log()
        resolve_workers(_settings(), 1, cores=8).log()
    assert logs == []


def test_explicit_workers_with_memory_limits_are_refused() -> None:
    """--workers 4 with per-process counters is an error naming the ways out."""
    with pytest.raises(WorkersRefused, match="memory_divide_per_worker"):
        resolve_workers(_settings(), 4, cores=8)


def test_division_accepted_or_no_auth_allows_workers() -> None:
    """Accepting per-worker division, or running without keys, allows several workers."""
    assert resolve_workers(_settings(divide=True), 4, cores=8).count == 4
    assert resolve_workers(_settings(auth=False), None, cores=8).count == 8
    assert resolve_workers(_settings(workers=3, divide=True), None, cores=8).count == 3


def test_one_worker_is_always_fine() -> None:
    """--workers 1 keeps the old single process whatever the limiter."""
    assert resolve_workers(_settings(), 1, cores=8).count == 1


def test_usable_cores_follow_the_cgroup_quota(tmp_path: Path) -> None:
    """A cgroup v2 quota of 1.5 CPUs gives 2 workers at most; 'max' leaves the affinity."""
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert usable_cores(tmp_path) == min(affinity, 2)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cores(tmp_path) == affinity
    assert usable_cores(tmp_path / "missing") == affinity


def test_no_pidfds_is_said_once_and_the_reaper_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without pidfds (before 5.3): the supervisor says so once and keeps its reaper
    (which still removes the group's directory), instead of failing to start workers."""

    def no_pidfds(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    settings = Settings.model_validate({"server": {"port": 0}, "auth": {"enabled": False}})
    supervisor = Supervisor(settings, 2, None)
    sleepers = [subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)]
    sleepers.append(subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE))
    try:
        supervisor._start_reaper()
        monkeypatch.setattr(os, "pidfd_open", no_pidfds)
        with capture_logs() as logs:
            for sleeper in sleepers:
                supervisor._announce(sleeper)
        assert [e["event"] for e in logs] == ["server.reaper_unavailable"]
        supervisor._check_reaper()  # still there: not restarted
        assert supervisor.share_dir.exists()
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        assert supervisor.reaper is not None
        supervisor.reaper.close()  # the supervisor's end: the reaper removes the directory
        supervisor.sock.close()
    deadline = time.monotonic() + patience(10)
    while supervisor.share_dir.exists():
        assert time.monotonic() < deadline, "the reaper did not remove the group's directory"
        time.sleep(0.05)


def test_a_reaper_that_cannot_start_is_said_and_not_fatal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The reaper's interpreter cannot be run: the supervisor logs it and goes on without
    one (the limit of before: a stopped or wedged worker outlives a SIGKILLed supervisor)."""
    settings = Settings.model_validate({"server": {"port": 0}, "auth": {"enabled": False}})
    supervisor = Supervisor(settings, 2, None)
    try:
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
        with capture_logs() as logs:
            supervisor._start_reaper()
            supervisor._check_reaper()  # nothing to restart
        assert [e["event"] for e in logs] == ["server.reaper_unavailable"]
        assert supervisor.reaper is None
    finally:
        supervisor.sock.close()
        supervisor.share_dir.rmdir()
