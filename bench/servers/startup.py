"""How long ``tiergate serve --workers N`` takes from exec until every worker serves.

    .venv/bin/python -m bench.servers.startup                    # 1, 2, 4 workers; 3 runs each
    .venv/bin/python -m bench.servers.startup --workers 2 --runs 20 --busy 1 --timeout 60
    .venv/bin/python -m bench.servers.startup --checkouts /tmp/base,.   # before/after a change

Each run starts the gateway (auth off, two tiers pointing at a closed port: nothing is reached) and
reads its log until every worker has logged ``server.worker_started`` (one process:
``server.started``, which it logs once it accepts). The time is from just before the exec.
``--checkouts`` names source trees whose ``gateway`` is started (``python -m`` runs from there, so
their code is imported; default: this one); their runs are interleaved. ``--busy K`` runs K busy-
looping processes beside it (a loaded node). A start that has not finished within ``--timeout``
seconds is a hang: each of its processes gets SIGUSR1 (every thread's stack on stderr) and the dump
is printed. The report is Markdown on stdout, and with ``--out FILE`` also written there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.harness.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(directory: Path) -> Path:
    closed = f"http://127.0.0.1:{free_port()}"  # nobody listens: probes fail, start does not
    config = {
        "auth": {"enabled": False},
        "tiers": {
            "fast": {"model": "tiergate-fast", "replicas": [closed]},
            "precise": {"model": "tiergate-precise", "replicas": [closed]},
        },
    }
    path = directory / "tiergate.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds ``pid`` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _is_worker(pid: int) -> bool:
    try:
        return b"--worker-index" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@dataclass
class _Took:
    """One start: seconds until every worker served, until the supervisor exec'd its first
    worker (and the CPU seconds it had used by then), and the CPU seconds of every process of
    the group until ready (load-independent, unlike the wall-clock times)."""

    ready_s: float
    spawn_s: float | None
    supervisor_cpu_s: float | None
    cpu_s: float


class _Run:
    """One start of the gateway, its output read by a thread."""

    def __init__(self, config: Path, workers: int, checkout: Path) -> None:
        self.workers = workers
        self.lines: list[str] = []
        self.ready_at: list[float] = []
        self.done = threading.Event()
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
        cmd += ["--port", str(free_port()), "--workers", str(workers)]
        env = {k: v for k, v in os.environ.items() if k != "TIERGATE_CONFIG"}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(  # our own interpreter and options
            cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        event = "server.started" if self.workers == 1 else "server.worker_started"
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if line.startswith("{") and json.loads(line).get("event") == event:
                self.ready_at.append(time.monotonic() - self.started)
                if len(self.ready_at) == self.workers:
                    self.done.set()

    def wait(self, timeout: float) -> _Took | None:
        """How the start went, or None (a hang: its stacks are dumped)."""
        spawn_s = supervisor_cpu_s = None
        deadline = self.started + timeout
        while not self.done.wait(0.005) and time.monotonic() < deadline:
            if spawn_s is None and any(_is_worker(p) for p in _children(self.proc.pid)):
                spawn_s = time.monotonic() - self.started
                supervisor_cpu_s = _cpu_s(self.proc.pid)
        if self.done.is_set():
            cpu_s = sum(map(_cpu_s, [self.proc.pid, *_children(self.proc.pid)]))
            return _Took(self.ready_at[-1], spawn_s, supervisor_cpu_s, cpu_s)
        # The CPU each process had by then: a starved start (a few seconds of CPU at most,
        # still importing) is told from a stuck one (its stack below; a process still
        # importing `gateway` itself has no SIGUSR1 handler yet, and dies of it).
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
            except OSError:  # exited meanwhile
                continue
            self.lines.append(f"pid {pid}: {_cpu_s(pid):.2f} s of CPU: {args.decode()}\n")
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                continue
        time.sleep(2)
        return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=5)


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f}" if known else "-"


def _busy(count: int) -> list[subprocess.Popen[bytes]]:
    loop = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


Legs = list[tuple[Path, int]]
Times = dict[tuple[Path, int], list[_Took]]


def _measure(args: argparse.Namespace, legs: Legs) -> tuple[Times, list[str]]:
    """Every leg ``args.runs`` times, interleaved; the times and the output of each hang."""
    hangs: list[str] = []
    busy = _busy(args.busy)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = _config(Path(tmp))
            times: Times = {leg: [] for leg in legs}
            for _ in range(args.runs):  # interleaved: drift in the machine's load is shared
                for tree, n in legs:
                    run = _Run(config, n, tree)
                    took = run.wait(args.timeout)
                    run.stop()
                    if took is None:
                        hangs.append("".join(run.lines)[-20000:])
                    else:
                        times[tree, n].append(took)
                    print(f"{tree} workers={n}: {took}", file=sys.stderr, flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    return times, hangs


def _table(legs: Legs, times: Times, runs: int) -> list[str]:
    rows = [
        "| checkout | workers | runs | hangs | ready s: median (min-max) | first worker exec'd s "
        "| supervisor CPU s by then | CPU s of the group until ready |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tree, n in legs:
        got = times[tree, n]
        cells = f"| {tree} | {n} | {runs} | {runs - len(got)} |"
        if not got:
            rows.append(f"{cells} - | - | - | - |")
            continue
        ready = [t.ready_s for t in got]
        spawn = _median([t.spawn_s for t in got])
        supervisor = _median([t.supervisor_cpu_s for t in got])
        cpu = statistics.median(t.cpu_s for t in got)
        rows.append(
            f"{cells} {statistics.median(ready):.2f} ({min(ready):.2f}-{max(ready):.2f}) "
            f"| {spawn} | {supervisor} | {cpu:.2f} |"
        )
    return rows


def main() -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes beside")
    parser.add_argument("--timeout", type=float, default=120.0, help="a start longer is a hang")
    parser.add_argument("--checkouts", default=str(REPO_ROOT), help="comma-separated trees")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    trees = [Path(t).resolve() for t in args.checkouts.split(",")]
    legs = [(tree, n) for n in counts for tree in trees]
    times, hangs = _measure(args, legs)
    command = "-m bench.servers.startup " + " ".join(sys.argv[1:])
    load = os.getloadavg()[0]
    rows = [f"`.venv/bin/python {command}` ({os.cpu_count()} CPUs, load {load:.1f} at end)", ""]
    report = "\n".join(rows + _table(legs, times, args.runs)) + "\n"
    for dump in hangs:
        report += "\n<details><summary>a start that hung</summary>\n\n```\n" + dump + "```\n"
        report += "</details>\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")
    return 1 if hangs else 0


if __name__ == "__main__":
    sys.exit(main())
