"""How much CPU did processes outside the benchmark use while a point ran?

On a shared 2-core machine a compiler or a test run elsewhere can halve a proxy's throughput.
The meter compares the machine's busy CPU time (/proc/stat) with the CPU time of the
benchmark's own processes (the servers' sessions, read from /proc/PID/stat, plus this process
and the wrk children it waited for); the rest is reported next to each point, so a noisy
number is visible as such.
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


def own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (wrk runs)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class CpuMeter:
    """Measures the share of machine capacity used by foreign processes between start/stop."""

    sessions: list[int] = field(default_factory=list)
    _start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def start(self) -> None:
        """Take the first sample."""
        ours = sessions_cpu_s(self.sessions) + own_cpu_s()
        self._start = (time.monotonic(), machine_busy_s(), ours)

    def stop(self) -> float:
        """Foreign CPU use since start, as a fraction of all cores (0.0 .. 1.0)."""
        ours = sessions_cpu_s(self.sessions) + own_cpu_s()
        elapsed = time.monotonic() - self._start[0]
        foreign = (machine_busy_s() - self._start[1]) - (ours - self._start[2])
        capacity = elapsed * (os.cpu_count() or 1)
        return max(0.0, foreign / capacity) if capacity > 0 else 0.0


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
        share = meter.stop()
        if share <= threshold or time.monotonic() >= deadline:
            return share
        if not told:
            print(
                f"  machine busy ({share:.0%} CPU used elsewhere); waiting up to "
                f"{max_wait_s:.0f} s for a quiet moment ...",
                flush=True,
            )
            told = True
