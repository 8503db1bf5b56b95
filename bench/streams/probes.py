"""What the streams benchmark reads from /proc while a wave runs: the CPU time and RSS of a
leg's processes, and the accept queue of its listening socket."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def session_pids(session: int) -> list[int]:
    """Every live process whose session id is ``session`` (a leg's server and its workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == session:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` (``/proc/PID/stat`` fields 14 and 15), in seconds."""
    ticks = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / CLOCK_TICKS


def rss_kib(pids: list[int]) -> int:
    """Summed VmRSS of ``pids``, in KiB (processes that are gone count 0)."""
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
    return total


def accept_queue(port: int) -> int:
    """Connections waiting to be accepted on ``port``'s listening sockets (``ss`` Recv-Q).

    ``ss`` asks the kernel over netlink with a filter, which stays cheap with thousands of
    open sockets (reading /proc/net/tcp would cost milliseconds per sample at that size).
    """
    try:
        proc = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return parse_ss_queue(proc.stdout)


def parse_ss_queue(text: str) -> int:
    """Summed Recv-Q of the LISTEN lines of ``ss -ltnH`` output."""
    waiting = 0
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 2 and cols[0] == "LISTEN":
            waiting += int(cols[1])
    return waiting


@dataclass
class Sampler:
    """Samples a leg's accept queue and RSS in a thread while a wave runs; keeps the maxima."""

    port: int
    pids: list[int]
    interval_s: float = 0.05
    max_queue: int = 0
    max_rss_kib: int = 0
    rss_series: list[tuple[float, int]] = field(default_factory=list)  # every second
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        rounds = 0
        while not self._stop.wait(self.interval_s):
            self.max_queue = max(self.max_queue, accept_queue(self.port))
            rounds += 1
            if rounds % 2 == 0:  # RSS every 100 ms
                rss = rss_kib(self.pids)
                self.max_rss_kib = max(self.max_rss_kib, rss)
                if rounds % 20 == 0:
                    self.rss_series.append((rounds * self.interval_s, rss))
