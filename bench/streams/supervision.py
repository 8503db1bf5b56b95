"""What a TierGate leg's supervisor did during a run, read from the gateway's own log.

With ``--workers N`` the supervisor restarts a worker that died (``server.worker_exited``) and
kills one whose heartbeat stopped (``server.worker_stalled``, after ``server.worker_stall_s``);
either cuts every stream on that worker. A run's stream errors alone do not say which, so the
report counts these lines in the leg's log (``<workdir>/<leg>/tiergate.log``, kept with
``--keep-workdir``) and quotes the first of each. :class:`HeartbeatWatch` also samples the
heartbeat the supervisor watches (each worker's metrics file, rewritten every second) and
reports the longest silence seen, to show how far from the watchdog's limit a run came.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

SUPERVISION_EVENTS = ("server.worker_stalled", "server.worker_exited", "server.workers_failing")
_QUOTE_CHARS = 240


def supervision_lines(log_text: str) -> dict[str, list[str]]:
    """The log's lines naming each supervision event (every event present, maybe empty)."""
    found: dict[str, list[str]] = {event: [] for event in SUPERVISION_EVENTS}
    for line in log_text.splitlines():
        for event in SUPERVISION_EVENTS:
            if event in line:
                found[event].append(line.strip())
    return found


def supervision_note(leg_name: str, log_path: Path) -> str:
    """One report line: how often each supervision event was logged, and the first of each."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError as exc:
        return f"- {leg_name}: gateway log {log_path} not read ({exc.strerror})."
    found = supervision_lines(text)
    counts = ", ".join(f"`{event}` {len(lines)}" for event, lines in found.items())
    quotes = "".join(
        f" First `{event}`: `{lines[0][:_QUOTE_CHARS]}`." for event, lines in found.items() if lines
    )
    return f"- {leg_name}: supervisor lines in the gateway log ({log_path.name}): {counts}.{quotes}"


def share_dir_of(supervisor_pid: int, proc: Path = Path("/proc")) -> Path | None:
    """The group directory (``--share-dir``) of a ``--workers N`` supervisor's children."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
        if parent == supervisor_pid and b"--share-dir" in argv:
            at = argv.index(b"--share-dir") + 1
            if at < len(argv):
                return Path(argv[at].decode())
    return None


class HeartbeatWatch:
    """Samples the workers' heartbeat files of one group every ``every_s`` on a thread; the
    longest time each file went unchanged (``longest_s``, by file name)."""

    def __init__(self, share_dir: Path, every_s: float = 0.1) -> None:
        self.share_dir = share_dir
        self.every_s = every_s
        self.longest_s: dict[str, float] = {}
        self._seen: dict[str, tuple[int, float]] = {}  # name -> (mtime_ns, seen changing at)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-watch", daemon=True)

    def sample(self, now: float) -> None:
        """One look at every heartbeat file (``now``: monotonic seconds)."""
        try:
            names = [p.name for p in self.share_dir.glob("metrics-*.prom")]
        except OSError:
            return
        for name in names:
            try:
                mtime = os.stat(self.share_dir / name).st_mtime_ns
            except OSError:
                continue
            last = self._seen.get(name)
            if last is None or last[0] != mtime:
                self._seen[name] = (mtime, now)
            silent = now - self._seen[name][1]
            self.longest_s[name] = max(self.longest_s.get(name, 0.0), silent)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample(time.monotonic())

    def start(self) -> HeartbeatWatch:
        """Start sampling."""
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop sampling; the longest silence of each file, in seconds."""
        self._stop.set()
        self._thread.join()
        return dict(sorted(self.longest_s.items()))


def heartbeat_note(leg_name: str, longest_s: dict[str, float], stall_s: float) -> str:
    """One report line: each worker's longest heartbeat silence against the watchdog's limit."""
    if not longest_s:
        return f"- {leg_name}: no worker heartbeat files seen (one process, or not found)."
    each = ", ".join(f"{name} {silent:.1f} s" for name, silent in longest_s.items())
    return (
        f"- {leg_name}: longest heartbeat silence (metrics file unchanged, sampled every "
        f"0.1 s) {each}; the watchdog kills a worker at {stall_s:g} s."
    )
