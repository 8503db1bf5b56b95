"""Did anything outside the benchmark disturb a point?

On a shared 2-core machine a compiler or a test run elsewhere can halve a proxy's throughput.
Two numbers per point: *foreign CPU*, the machine's busy time (/proc/stat) minus the CPU time
of the benchmark's own processes (the servers' sessions, plus this process and the wrk
children it waited for), and *run-queue wait*, the time the servers' threads were runnable but
not running (/proc/PID/task/TID/schedstat). With the servers at high priority, other work
mostly fills idle cycles (foreign CPU stays high, harmlessly); the wait share is what shows
that the servers themselves were held back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
# /proc/stat "cpu" columns: user nice system idle iowait irq softirq steal ...
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (idle and iowait excluded)."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(first[i]) for i in _BUSY_COLUMNS) / _TICKS


def sessions_cpu_s(sessions: Iterable[int]) -> float:
    """CPU seconds (user + system, all threads) of every live process in the given sessions."""
    wanted = set(sessions)
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) not in wanted:
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the ")" closing the command name: state is [0]; utime/stime are [11]/[12].
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def sessions_run_delay_s(sessions: Iterable[int]) -> float:
    """Seconds the threads of the given sessions spent runnable but waiting for a CPU."""
    wanted = set(sessions)
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) not in wanted:
                continue
            for task in (entry / "task").iterdir():
                total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (wrk runs)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True)
class Noise:
    """What happened around one point."""

    foreign_share: float  # CPU used by other processes, as a share of all cores
    wait_share: float  # the servers' run-queue wait, as a share of the point's wall time


@dataclass
class CpuMeter:
    """Measures foreign CPU use and the servers' run-queue wait between start and stop."""

    sessions: list[int] = field(default_factory=list)  # every server of the benchmark
    waiters: list[int] = field(default_factory=list)  # the servers whose wait is reported
    _start: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def start(self) -> None:
        """Take the first sample."""
        ours = sessions_cpu_s(self.sessions) + own_cpu_s()
        waited = sessions_run_delay_s(self.waiters)
        self._start = (time.monotonic(), machine_busy_s(), ours, waited)

    def stop(self) -> Noise:
        """Foreign CPU (share of all cores) and run-queue wait (share of wall time) since start."""
        ours = sessions_cpu_s(self.sessions) + own_cpu_s()
        waited = sessions_run_delay_s(self.waiters) - self._start[3]
        elapsed = time.monotonic() - self._start[0]
        foreign = (machine_busy_s() - self._start[1]) - (ours - self._start[2])
        capacity = elapsed * (os.cpu_count() or 1)
        if elapsed <= 0:
            return Noise(0.0, 0.0)
        return Noise(max(0.0, foreign / capacity), max(0.0, waited / elapsed))


def wait_until_quiet(
    sessions: list[int], threshold: float, max_wait_s: float, window_s: float = 2.0
) -> float:
    """Wait (at most ``max_wait_s``) for a window with foreign CPU at or below ``threshold``.

    Returns the last window's foreign share; the caller decides what a still-busy machine means.
    """
    meter = CpuMeter(sessions)
    deadline = time.monotonic() + max_wait_s
    told = False
    while True:
        meter.start()
        time.sleep(window_s)
        share = meter.stop().foreign_share
        if share <= threshold or time.monotonic() >= deadline:
            return share
        if not told:
            print(
                f"  machine busy ({share:.0%} CPU used elsewhere); waiting up to "
                f"{max_wait_s:.0f} s for a quiet moment ...",
                flush=True,
            )
            told = True
