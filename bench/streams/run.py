"""Streams at scale (issue 37): N concurrent streaming chat requests through every leg.

For each leg (direct, nginx, TierGate plain / full / 2 workers, vllm-router, Portkey, LiteLLM)
and each N of the ladder, N streams start evenly over ``--ramp-s`` and are held open for their
whole answer (``--tokens`` events at ``--tokens-per-s`` from ``bench/streams/upstream.py``).
The client (``bench/streams/client.py``) timestamps every event; the orchestrator reads the
leg's CPU time and RSS from /proc and samples its accept queue with ``ss``. Then a disconnect
storm (half the clients hang up mid-answer; with ``--storm-control`` after a wave of its shape
where nobody does), many slow streams held at once, and (with
``--stop-streams N``) the stop test: a share of the clients (``--stop-fraction``, long answers
padded to fill the buffers on the way in seconds) stops reading mid-answer with its socket left
open, against a control wave of the same streams all reading; the other streams' gaps, how the
stopped streams ended and the leg's RSS over the wave are reported.

A TierGate leg written ``NAME@REV`` (e.g. ``tiergate-plain@HEAD~1``) runs that revision's
code from a temporary worktree beside this checkout's, for a same-run A/B.

Run: ``.venv/bin/python bench/streams/run.py [--ladder 100,1000,2000] [--legs direct,...]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.harness.legs import REPO_ROOT, Leg, LegUnavailableError, Placement
from bench.harness.processes import boosted_own_session
from bench.overhead import ab
from bench.streams.legs import ALL_LEGS, UpstreamPace, start_stream_upstream, starter
from bench.streams.report import Run, errors, render
from bench.streams.supervision import HeartbeatWatch, heartbeat_note, share_dir_of, supervision_note
from bench.streams.upstream import raise_fd_limit
from bench.streams.wave import (
    StopSpec,
    WaveResult,
    WaveSpec,
    leg_rss_kib,
    load_average,
    run_wave,
)
from gateway.config.settings import Settings

STORM_LEGS = "direct,nginx,tiergate-plain,tiergate-full"
CEILING_LEGS = "direct,tiergate-plain"
WARMUP = WaveSpec(streams=20, tokens=8, ramp_s=0.2, deadline_s=20)
# A leg whose wave fails more often than this, or has a stream still open at the deadline
# (answer time + 30 s), skips the larger N: it is past what it can carry.
STOP_ERROR_SHARE = 0.1
WORKER_STALL_S = Settings().server.worker_stall_s  # the legs' configs keep the default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladder", default="100,1000,2000", help="stream counts, up to 10000")
    parser.add_argument("--legs", default=",".join(ALL_LEGS))
    parser.add_argument("--tokens", type=int, default=64, help="content events per answer")
    parser.add_argument("--tokens-per-s", type=float, default=20.0)
    parser.add_argument("--first-token-ms", type=float, default=0.0)
    parser.add_argument("--ramp-s", type=float, default=1.0)
    parser.add_argument("--storm-streams", type=int, default=1000, help="0 skips the storm")
    parser.add_argument("--storm-legs", default=STORM_LEGS)
    parser.add_argument("--storm-tokens", type=int, default=120)
    parser.add_argument(
        "--storms", type=int, default=1, help="storms in a row per leg (the report shows the last)"
    )
    parser.add_argument(
        "--storm-control",
        action="store_true",
        help="before the storms, one wave of the storm's shape in which nobody hangs up, so the "
        "storm's RSS is compared with a level that has already held as many streams at once",
    )
    parser.add_argument("--ceiling-streams", type=int, default=10000, help="0 skips it")
    parser.add_argument("--ceiling-legs", default=CEILING_LEGS)
    parser.add_argument("--ceiling-tokens-per-s", type=float, default=1.0)
    parser.add_argument("--ceiling-tokens", type=int, default=8)
    parser.add_argument("--stop-streams", type=int, default=0, help="0 skips the stop test")
    parser.add_argument("--stop-legs", default="tiergate-plain")
    parser.add_argument("--stop-fraction", type=float, default=0.1)
    parser.add_argument("--stop-at-s", type=float, default=2.0)
    parser.add_argument("--stop-hold-s", type=float, default=30.0)
    parser.add_argument("--stop-tokens", type=int, default=800)
    parser.add_argument("--stop-pad", type=int, default=2000)
    parser.add_argument(
        "--leg-nofile", type=int, default=0, help="the proxies' open-file soft limit (prlimit)"
    )
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--no-boost", action="store_true")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=None, help="default bench/results/streams-ladder.md"
    )
    args = parser.parse_args(argv)
    args.ladder_n = [int(n) for n in args.ladder.split(",") if n]
    if not args.ladder_n or max(args.ladder_n) > 10_000 or min(args.ladder_n) < 1:
        parser.error("--ladder takes stream counts from 1 to 10000")
    args.leg_names = [name for name in args.legs.split(",") if name]
    for name in args.leg_names:
        if name != "direct":
            starter(name)  # unknown names fail here, before anything starts
        if "@" in name and not name.startswith("tiergate"):
            parser.error(f"{name}: only TierGate legs take @REV")
    return args


def header(args: argparse.Namespace, argv: list[str], pin: Placement) -> list[str]:
    """The report's title, command and conditions."""
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())  # fmt: skip
    placement = "gateway alone on CPU 0; client, upstream, Redis, OTLP sink on CPU 1"
    if args.no_pin or not pin.proxy:
        placement = "not pinned"
    return [
        "# Streams at scale (issue 37)",
        "",
        f"Command: `{shlex.join(['.venv/bin/python', 'bench/streams/run.py', *argv])}`",
        "",
        f"Commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}, "
        f"{os.cpu_count()} CPUs, load average at start {loadavg()}",
        f"Placement: {placement}; {'nice -20' if pin.boosted else 'normal priority'}"
        + (
            f"; proxies start with an open-file soft limit of {args.leg_nofile}"
            if args.leg_nofile
            else ""
        )
        + f"; open-file limit {resource.getrlimit(resource.RLIMIT_NOFILE)[1]:,} (hard).",
        f"Each stream: {args.tokens} content events at {args.tokens_per_s:g}/s, first after "
        f"{args.first_token_ms:g} ms; N streams start evenly over {args.ramp_s:g} s, one "
        "connection each, held for the whole answer.",
        "",
        "Columns: *added* is the leg's value minus direct's at the same N in this run. *gap* is "
        "the time between consecutive events of one stream at the client; *event delay* is "
        "from the upstream's write (timestamp in the event) to the client's read. *CPU* is the "
        "user+system time of the leg's processes (all workers; Redis and the OTLP sink not "
        "included) over the wave, per 1,000 events the client received. *RSS per stream* is "
        "(peak RSS during the wave - RSS of the freshly started leg, before its warm-up) / N. "
        "*accept queue max* is the largest Recv-Q "
        "of the leg's listening socket (`ss -ltn`, every 50 ms): connections the kernel "
        "accepted that the process had not yet taken. *upstream core* is the upstream's share "
        "of its core (headroom check). *other CPU* is the machine's busy time outside the "
        "benchmark's processes, as a share of both cores; *leg waits* is the time the leg's "
        "threads were runnable but not running (`/proc/PID/task/TID/schedstat`), as a share "
        "of the wave, bold above 5 % (other work on its core delayed it).",
    ]


def loadavg() -> str:
    """The machine's 1, 5 and 15-minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def start_leg(name: str, upstream: Leg, workdir: Path, pin: Placement) -> Leg:
    """Start leg ``name`` (the upstream itself for direct; ``NAME@REV``: REV's code)."""
    if name == "direct":
        return upstream
    leg_dir = workdir / name.replace("@", "-at-")
    leg_dir.mkdir(exist_ok=True)
    if "@" not in name:
        return starter(name)(upstream, leg_dir, pin)
    commit = ab.resolve(name.split("@", 1)[1])
    tree = workdir / "trees" / commit
    if not tree.exists():
        tree.parent.mkdir(exist_ok=True)
        ab.checkout(commit, tree.parent)
    return starter(name, ab.launcher(tree), commit)(upstream, leg_dir, pin)


def failed_share(result: WaveResult) -> float:
    """Share of a wave's streams that ended in an error."""
    return errors(result) / max(1, result.streams)


def say(result: WaveResult, what: str) -> None:
    """One progress line."""
    client = result.client
    print(
        f"  {what} N={result.streams}: {client['events']} events, errors {client['errors']}, "
        f"ttft p99 {client['ttft_ms']['p99']:.1f} ms, gap p99 {client['gap_ms']['p99']:.1f} ms, "
        f"cpu {result.cpu_s:.2f} s, queue max {result.accept_queue_max}",
        flush=True,
    )


def measure_leg(name: str, leg: Leg, upstream: Leg, args: argparse.Namespace, run: Run) -> None:
    """Warm-up, the ladder, and the storm and slow-stream waves where asked."""
    pin = args.pin
    fresh = leg_rss_kib(leg)
    warm = run_wave(leg, upstream, WARMUP, pin)
    if errors(warm):
        logged = [line for line in leg.main.log_tail().splitlines() if "rror" in line]
        why = "; ".join(warm.client["error_examples"])
        run.skipped[name] = f"streaming warm-up failed: {why}" + (
            f"; its log: `{logged[0].strip()[:200]}`" if logged else ""
        )
        print(f"  skipped: {run.skipped[name]}", flush=True)
        return
    run.ladder[name] = []
    answer_s = args.tokens / args.tokens_per_s
    for n in args.ladder_n:
        spec = WaveSpec(n, args.tokens, args.ramp_s, deadline_s=answer_s + 30)
        result = run_wave(leg, upstream, spec, pin, fresh)
        run.ladder[name].append(result)
        say(result, "ladder")
        late = result.client["errors"].get("deadline", 0)
        if failed_share(result) > STOP_ERROR_SHARE or late:
            run.notes.append(f"- {leg.name}: larger N skipped after {errors(result):,} errors "
                             f"({late:,} past the deadline) at N={n:,}.")  # fmt: skip
            break
    if name in args.storm_legs.split(",") and args.storm_streams:
        storm_s = args.storm_tokens / args.tokens_per_s
        # Hang-ups come a third of an answer after the last stream started: with a ramp longer
        # than a third of an answer the first streams would be at their end by then (answered,
        # not abandoned), so the storm's ramp is at most that long.
        ramp_s = min(args.ramp_s, storm_s / 3)
        spec = WaveSpec(args.storm_streams, args.storm_tokens, ramp_s, storm_s + 30,
                        hangup_fraction=0.5, hangup_at_s=ramp_s + storm_s / 3)  # fmt: skip
        if args.storm_control:
            # The same streams, all read to the end: the storm then starts from a working set
            # that has already held this many streams at once, and what it adds is what the
            # abandoned streams leave behind (not a new peak's allocator high-water mark).
            control = run_wave(leg, upstream, replace(spec, hangup_fraction=0.0), pin)
            run.storm_controls[name] = control
            say(control, "storm control")
            before, after = control.rss_before_kib, control.rss_after_kib
            grown = f"{100 * (after - before) / before:+.1f} %" if before else "not read"
            run.notes.append(
                f"- {leg.name}: storm control (the storm's shape, nobody hangs up), RSS before / "
                f"after {before:,} / {after:,} KiB ({grown}); the storm below starts from its "
                "level."
            )
        for k in range(1, args.storms + 1):  # in a row: what one storm leaves, the next adds to
            run.storms[name] = storm = run_wave(leg, upstream, spec, pin)
            say(storm, "storm")
            if args.storms > 1:
                rss = f"RSS before / after {storm.rss_before_kib:,} / {storm.rss_after_kib:,} KiB"
                run.notes.append(f"- {leg.name}: storm {k} of {args.storms}, {rss}.")
    if name in args.ceiling_legs.split(",") and args.ceiling_streams:
        rate, tokens = args.ceiling_tokens_per_s, args.ceiling_tokens
        spec = WaveSpec(args.ceiling_streams, tokens, max(args.ramp_s, 3.0),
                        tokens / rate + 30, tokens_per_s=rate)  # fmt: skip
        run.ceilings[name] = run_wave(leg, upstream, spec, pin, fresh)
        say(run.ceilings[name], "slow streams")
    stop_waves(name, leg, upstream, args, run)


def stop_waves(name: str, leg: Leg, upstream: Leg, args: argparse.Namespace, run: Run) -> None:
    """The stop test: the same streams twice, a share of them (long, padded answers) reading
    on in the control wave and stopping mid-answer in the second, socket left open."""
    if name not in args.stop_legs.split(",") or not args.stop_streams:
        return
    waves = []
    for at_s in (0.0, args.stop_at_s):
        stop = StopSpec(args.stop_fraction, at_s, args.stop_hold_s, args.stop_tokens,
                        args.stop_pad)  # fmt: skip
        deadline = args.stop_tokens / args.tokens_per_s + 30
        spec = WaveSpec(args.stop_streams, args.tokens, args.ramp_s, deadline, stop=stop)
        waves.append(run_wave(leg, upstream, spec, args.pin))
        say(waves[-1], "stoppers" if at_s else "stop control")
    run.stops[name] = (waves[0], waves[1])


def heartbeat_watch(leg: Leg) -> HeartbeatWatch | None:
    """A watch on the heartbeats of a TierGate leg's workers (None for one process: no
    supervisor, no watchdog)."""
    if leg.main.proc is None:
        return None
    share = share_dir_of(leg.main.proc.pid)
    return HeartbeatWatch(share).start() if share is not None else None


def compact(result: WaveResult) -> dict[str, object]:
    """A wave's numbers for the raw JSON file, without the per-stream hang-up and abort lists
    (their counts and latencies are in the report)."""
    raw = result.as_dict()
    raw["aborts"] = len(raw["aborts"])
    raw["client"] = {**raw["client"], "hangups": len(raw["client"]["hangups"])}
    return raw


def main(argv: list[str] | None = None) -> int:
    """Run every leg and write the report."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # A TERM (or an INT where the shell ignores it) still stops every server the run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.pin = Placement.build(pin=not args.no_pin, boost=not args.no_boost)
    # Inherited by every server the run starts; a proxy holds two descriptors per stream.
    most = max(*args.ladder_n, args.ceiling_streams, args.storm_streams, args.stop_streams)
    hard = raise_fd_limit(at_least=2 * most + 1024)
    if args.leg_nofile:  # e.g. a distribution's default soft limit, 1024
        limit = ("prlimit", f"--nofile={args.leg_nofile}:{hard}")
        args.pin = Placement((*args.pin.proxy, *limit), args.pin.load)
    out = args.out or REPO_ROOT / "bench" / "results" / "streams-ladder.md"
    run = Run(header(args, argv, args.pin))
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-streams-"))
    pace = UpstreamPace(args.tokens_per_s, args.first_token_ms)
    with boosted_own_session():
        upstream = start_stream_upstream(workdir, args.pin, pace)
        try:
            for name in args.leg_names:
                print(f"{name} (load {load_average():.1f}) ...", flush=True)
                try:
                    leg = start_leg(name, upstream, workdir, args.pin)
                except LegUnavailableError as exc:
                    run.skipped[name] = str(exc).splitlines()[0][:300]
                    print(f"  skipped: {run.skipped[name]}", flush=True)
                    continue
                watch = heartbeat_watch(leg) if name.startswith("tiergate") else None
                try:
                    measure_leg(name, leg, upstream, args, run)
                finally:
                    longest = watch.stop() if watch is not None else {}
                    if leg is not upstream:
                        leg.stop()
                if watch is not None:  # a group of workers; after the stop: its log is complete
                    run.notes.append(heartbeat_note(leg.name, longest, WORKER_STALL_S))
                    run.notes.append(supervision_note(leg.name, leg.main.log_path))
        finally:
            upstream.stop()
            for tree in (workdir / "trees").glob("*"):
                ab.remove(tree)
    run.notes.append(f"- Load average (1, 5, 15 min) at the end: {loadavg()}.")
    out.write_text(render(run))
    raw = {"ladder": {k: [compact(w) for w in v] for k, v in run.ladder.items()},
           "storms": {k: compact(w) for k, w in run.storms.items()},
           "storm_controls": {k: compact(w) for k, w in run.storm_controls.items()},
           "ceilings": {k: compact(w) for k, w in run.ceilings.items()},
           "stops": {k: [compact(w) for w in ws] for k, ws in run.stops.items()},
           "skipped": run.skipped}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    print(f"wrote {out} (workdir {workdir}{'' if args.keep_workdir else ', removed'})")
    if not args.keep_workdir:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
