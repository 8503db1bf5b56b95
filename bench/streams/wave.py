"""One wave of the streams benchmark: N streams through one leg, with the leg's CPU time, RSS
and accept queue read around and during it, and the upstream's counters before and after."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.cpu_noise import CpuMeter
from bench.harness.legs import Leg, Placement
from bench.streams.probes import Sampler, cpu_seconds, rss_kib, session_pids
from bench.streams.stats import summary

CLIENT = Path(__file__).with_name("client.py")


@dataclass(frozen=True)
class WaveSpec:
    """What a wave asks for."""

    streams: int
    tokens: int
    ramp_s: float
    deadline_s: float = 60.0
    hangup_fraction: float = 0.0
    hangup_at_s: float = 0.0
    tokens_per_s: float | None = None  # per-request override of the upstream's pace
    stop: StopSpec | None = None  # a share of clients that stop reading (client.py --stop-*)


@dataclass(frozen=True)
class StopSpec:
    """Clients that stop reading: which share, when (0: never, the control), for how long,
    and their answers (``tokens`` events of ``pad`` more bytes each)."""

    fraction: float
    at_s: float
    hold_s: float
    tokens: int
    pad: int

    def args(self) -> list[str]:
        """The client's options."""
        return ["--stop-fraction", str(self.fraction), "--stop-at-s", str(self.at_s),
                "--stop-hold-s", str(self.hold_s), "--stop-tokens", str(self.tokens),
                "--stop-pad", str(self.pad)]  # fmt: skip


@dataclass
class WaveResult:
    """Everything measured in one wave."""

    leg: str
    streams: int
    client: dict[str, Any]
    wall_s: float
    cpu_s: float
    upstream_cpu_s: float
    upstream_events: int
    rss_before_kib: int
    rss_peak_kib: int
    rss_after_kib: int
    accept_queue_max: int
    load1: float
    rss_start_kib: int = 0  # the leg's RSS when it had just started, before any stream
    foreign_share: float = 0.0  # CPU used by processes outside the benchmark, share of all cores
    wait_share: float = 0.0  # the leg's threads runnable but not running, share of the wave
    aborts: list[tuple[int, int]] = field(default_factory=list)
    rss_series: list[tuple[float, int]] = field(default_factory=list)  # (s into the wave, KiB)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the raw JSON file."""
        return asdict(self)


def leg_rss_kib(leg: Leg) -> int:
    """RSS of all of ``leg``'s processes now, in KiB."""
    return rss_kib(session_pids(leg.main.proc.pid)) if leg.main.proc is not None else 0


def upstream_stats(upstream: Leg) -> dict[str, Any]:
    """The upstream's ``GET /stats`` counters."""
    with urllib.request.urlopen(upstream.base_url + "/stats", timeout=10) as response:  # noqa: S310 - http://127.0.0.1 built here
        stats: dict[str, Any] = json.loads(response.read())
        return stats


def load_average() -> float:
    """The 1-minute load average of the machine."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def client_command(leg: Leg, spec: WaveSpec, pin: Placement) -> list[str]:
    """The load client's command line for ``leg`` (on the load core)."""
    cmd = [*pin.load, sys.executable, str(CLIENT), "--url", leg.base_url, "--path", leg.chat_path]
    cmd += ["--model", leg.model, "--streams", str(spec.streams), "--max-tokens", str(spec.tokens)]
    cmd += ["--ramp-s", str(spec.ramp_s), "--deadline-s", str(spec.deadline_s)]
    if leg.api_key:
        cmd += ["--key", leg.api_key]
    for name, value in leg.headers.items():
        cmd += ["--header", f"{name}: {value}"]
    if spec.hangup_fraction:
        cmd += ["--hangup-fraction", str(spec.hangup_fraction)]
        cmd += ["--hangup-at-s", str(spec.hangup_at_s)]
    if spec.tokens_per_s:
        cmd += ["--tokens-per-s", str(spec.tokens_per_s)]
    if spec.stop is not None:
        cmd += spec.stop.args()
    return cmd


def wait_upstream_idle(upstream: Leg, timeout_s: float) -> dict[str, Any]:
    """Wait until the upstream has no open stream (or ``timeout_s``); its last counters."""
    deadline = time.monotonic() + timeout_s
    stats = upstream_stats(upstream)
    while stats["open"] > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = upstream_stats(upstream)
    return stats


def run_wave(
    leg: Leg, upstream: Leg, spec: WaveSpec, pin: Placement, rss_start_kib: int = 0
) -> WaveResult:
    """Run ``spec`` through ``leg`` and read what it cost (``rss_start_kib``: see WaveResult)."""
    if leg.main.proc is None or upstream.main.proc is None:
        raise RuntimeError(f"{leg.name} is not running")
    pids = session_pids(leg.main.proc.pid)
    up_pids = session_pids(upstream.main.proc.pid)
    before = upstream_stats(upstream)
    cpu0, up0, rss0 = cpu_seconds(pids), cpu_seconds(up_pids), rss_kib(pids)
    load1 = load_average()
    meter = CpuMeter(sessions=[*leg.sessions(), *upstream.sessions()], waiters=leg.sessions()[:1])
    meter.start()
    start = time.monotonic()
    with Sampler(leg.main.port, pids) as sampler:
        proc = subprocess.run(
            client_command(leg, spec, pin),
            capture_output=True,
            text=True,
            timeout=spec.ramp_s + spec.deadline_s + (spec.stop.hold_s if spec.stop else 0) + 60,
            check=False,
        )
    wall = time.monotonic() - start
    noise = meter.stop()
    cpu1, up1 = cpu_seconds(pids), cpu_seconds(up_pids)
    if proc.returncode != 0:
        raise RuntimeError(f"client failed ({proc.returncode}): {proc.stderr[-2000:]}")
    after = wait_upstream_idle(upstream, timeout_s=10)
    time.sleep(1.0)  # let the proxy drop what the wave left behind before RSS is read again
    return WaveResult(
        leg=leg.name,
        streams=spec.streams,
        client=json.loads(proc.stdout),
        wall_s=wall,
        cpu_s=cpu1 - cpu0,
        upstream_cpu_s=up1 - up0,
        upstream_events=after["content_events"] - before["content_events"],
        rss_before_kib=rss0,
        rss_peak_kib=max(sampler.max_rss_kib, rss0),
        rss_after_kib=rss_kib(pids),
        accept_queue_max=sampler.max_queue,
        load1=load1,
        rss_start_kib=rss_start_kib or rss0,
        foreign_share=noise.foreign_share,
        wait_share=noise.wait_share,
        aborts=[(int(a[0]), int(a[1])) for a in after["aborts"][len(before["aborts"]) :]],
        rss_series=sampler.rss_series,
    )


def abort_latencies_ms(result: WaveResult) -> tuple[list[float], int]:
    """For every stream the client hung up: ms until the upstream saw its close; and how many
    hung-up streams the upstream never saw closed (answered to the end instead)."""
    closed = dict(result.aborts)
    latencies = []
    missing = 0
    for number, hung_up in result.client["hangups"]:
        if number in closed:
            latencies.append((closed[number] - hung_up) / 1e6)
        else:
            missing += 1
    return latencies, missing


def abort_summary(result: WaveResult) -> dict[str, float]:
    """Abort latency p50/p99/max, and counts, of a disconnect-storm wave."""
    latencies, missing = abort_latencies_ms(result)
    stats = summary(latencies)
    stats["hung_up"] = float(len(result.client["hangups"]))
    stats["within_1s"] = float(sum(1 for value in latencies if value <= 1000))
    stats["never_aborted"] = float(missing)
    return stats
