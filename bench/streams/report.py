"""The streams benchmark's Markdown report, from its waves."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.streams.stats import per_thousand
from bench.streams.wave import WaveResult, abort_summary

GAP_TARGET_MS = 10.0  # the "holds N" bar: added gap p99 at most this, no error
DIRECT = "direct"


@dataclass
class Run:
    """Every wave of a run, by kind, with the legs that could not run and why."""

    header: list[str]
    ladder: dict[str, list[WaveResult]] = field(default_factory=dict)  # leg key -> waves
    storms: dict[str, WaveResult] = field(default_factory=dict)
    # leg key -> the storm's shape with no hang-ups, run just before the storms (--storm-control)
    storm_controls: dict[str, WaveResult] = field(default_factory=dict)
    ceilings: dict[str, WaveResult] = field(default_factory=dict)
    # leg key -> (control: the same streams all read on; the wave where some stop reading)
    stops: dict[str, tuple[WaveResult, WaveResult]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def fmt(value: float, digits: int = 1) -> str:
    """A number with thousands separators, or a dash when it is not a number."""
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def signed(value: float, digits: int = 1) -> str:
    """A difference with its sign."""
    return "-" if math.isnan(value) else f"{value:+,.{digits}f}"


def errors(result: WaveResult) -> int:
    """Streams that ended in an error."""
    return int(sum(result.client["errors"].values()))


def triple(result: WaveResult, key: str, direct: WaveResult | None, keys: Iterable[str]) -> str:
    """``a / b`` of a percentile set, with what it adds over direct in brackets."""
    own = result.client[key]
    text = " / ".join(fmt(own[k]) for k in keys)
    if direct is None or result is direct:
        return text
    base = direct.client[key]
    return text + " (" + " / ".join(signed(own[k] - base[k]) for k in keys) + ")"


def cpu_cell(result: WaveResult) -> str:
    """CPU-seconds per 1,000 relayed events, and the share of one core over the wave."""
    per_k = per_thousand(result.cpu_s, result.client["events"])
    return f"{fmt(per_k, 3)} ({fmt(100 * result.cpu_s / result.wall_s, 0)} %)"


def noise(result: WaveResult) -> str:
    """Foreign CPU (share of the machine) and the leg's run-queue wait (share of the wave);
    a wait above 5 % is bold: the leg was kept off its core."""
    wait = f"{100 * result.wait_share:.0f} %"
    if result.wait_share > 0.05:
        wait = f"**{wait}**"
    return f"{100 * result.foreign_share:.0f} % / {wait}"


def rss_per_stream(result: WaveResult) -> float:
    """KiB of RSS the wave's peak holds above the freshly started process, per open stream."""
    return (result.rss_peak_kib - result.rss_start_kib) / max(1, result.streams)


def ladder_rows(run: Run) -> list[str]:
    """The main table: one row per leg and N."""
    lines = [
        "| leg | N | events/s | errors | events out / in | TTFT p50 / p99 ms (added) "
        "| gap p50 / p99 / max ms (added) | event delay p50 / p99 ms (added) "
        "| CPU s per 1k events (core) | RSS KiB per stream | accept queue max "
        "| upstream core | other CPU / leg waits |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    directs = {r.streams: r for r in run.ladder.get(DIRECT, [])}
    for waves in run.ladder.values():
        for result in waves:
            direct = directs.get(result.streams)
            client = result.client
            lines.append(
                f"| {result.leg} | {result.streams:,} | {fmt(client['events_per_s'], 0)} "
                f"| {errors(result)} | {client['events']:,} / {result.upstream_events:,} "
                f"| {triple(result, 'ttft_ms', direct, ('p50', 'p99'))} "
                f"| {triple(result, 'gap_ms', direct, ('p50', 'p99', 'max'))} "
                f"| {triple(result, 'delay_ms', direct, ('p50', 'p99'))} "
                f"| {cpu_cell(result)} | {fmt(rss_per_stream(result))} "
                f"| {result.accept_queue_max:,} "
                f"| {fmt(100 * result.upstream_cpu_s / result.wall_s, 0)} % | {noise(result)} |"
            )
    return lines


def holds(run: Run) -> list[str]:
    """Per leg, the largest N with added gap p99 <= the target and no error."""
    directs = {r.streams: r for r in run.ladder.get(DIRECT, [])}
    lines = []
    for key, waves in run.ladder.items():
        if key == DIRECT or not waves:
            continue
        best = 0
        for result in waves:
            direct = directs.get(result.streams)
            if direct is None:
                continue
            gap = result.client["gap_ms"]["p99"] - direct.client["gap_ms"]["p99"]
            if errors(result) == 0 and gap <= GAP_TARGET_MS:
                best = max(best, result.streams)
        held = f"{best:,}" if best else "none of the ladder"
        lines.append(f"- {waves[0].leg}: {held}")
    return lines


def storm_rows(run: Run) -> list[str]:
    """The disconnect storm: how fast the upstream saw abandoned streams closed; RSS after."""
    lines = [
        "| leg | N | hung up | upstream aborted within 1 s | abort latency p50 / p99 / max ms "
        "| never aborted | other streams' errors | RSS before / peak / after MiB "
        "| after vs before |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in run.storms.values():
        stats = abort_summary(result)
        keys = ("p50", "p99", "max")
        before, after = result.rss_before_kib / 1024, result.rss_after_kib / 1024
        lines.append(
            f"| {result.leg} | {result.streams:,} | {int(stats['hung_up']):,} "
            f"| {int(stats['within_1s']):,} | {' / '.join(fmt(stats[k]) for k in keys)} "
            f"| {int(stats['never_aborted']):,} | {errors(result)} "
            f"| {before:,.1f} / {result.rss_peak_kib / 1024:,.1f} / {after:,.1f} "
            f"| {signed(100 * (after - before) / before if before else math.nan)} % |"
        )
    return lines


def ceiling_rows(run: Run) -> list[str]:
    """Many slow streams held open at once."""
    lines = [
        "| leg | N | events/s | errors | events out / in | TTFT p99 ms | gap p99 / max ms "
        "| CPU s per 1k events (core) | RSS KiB per stream | accept queue max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in run.ceilings.values():
        client = result.client
        lines.append(
            f"| {result.leg} | {result.streams:,} | {fmt(client['events_per_s'], 0)} "
            f"| {errors(result)} | {client['events']:,} / {result.upstream_events:,} "
            f"| {fmt(client['ttft_ms']['p99'])} "
            f"| {fmt(client['gap_ms']['p99'])} / {fmt(client['gap_ms']['max'])} "
            f"| {cpu_cell(result)} | {fmt(rss_per_stream(result))} "
            f"| {result.accept_queue_max:,} |"
        )
    return lines


def rss_line(result: WaveResult) -> str:
    """RSS every 5 s of a wave, in MiB."""
    series = [f"{t:.0f} s: {kib / 1024:,.1f}" for t, kib in result.rss_series if round(t) % 5 == 0]
    return ", ".join(series)


def stop_rows(run: Run) -> list[str]:
    """Clients that stop reading: the others' gaps against the control wave, how the stopped
    streams ended, and the leg's RSS over the wave."""
    lines = [
        "| leg | N | stopped | others' gap p50 / p99 / max ms, all reading "
        "| ... with the stoppers stopped | p99 moved | others' errors "
        "| stopped streams cut / complete / open | RSS start / peak / end MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    series = []
    for control, stopped in run.stops.values():
        keys = ("p50", "p99", "max")
        calm, hit = control.client["gap_ms"], stopped.client["gap_ms"]
        ends = stopped.client["stoppers"]
        lines.append(
            f"| {stopped.leg} | {stopped.streams:,} | {ends['stopped']:,} "
            f"| {' / '.join(fmt(calm[k]) for k in keys)} "
            f"| {' / '.join(fmt(hit[k]) for k in keys)} | {signed(hit['p99'] - calm['p99'])} "
            f"| {errors(control)} / {errors(stopped)} "
            f"| {ends.get('cut', 0):,} / {ends.get('complete', 0):,} / {ends.get('open', 0):,} "
            f"| {stopped.rss_before_kib / 1024:,.1f} / {stopped.rss_peak_kib / 1024:,.1f} "
            f"/ {stopped.rss_after_kib / 1024:,.1f} |"
        )
        series.append(f"- {stopped.leg}, RSS MiB over the wave with stoppers: {rss_line(stopped)}")
    return [*lines, "", *series]


def error_lines(run: Run) -> list[str]:
    """Example error messages of every wave that had errors."""
    lines = []
    waves = [w for ws in run.ladder.values() for w in ws]
    for result in [*waves, *run.storm_controls.values(), *run.storms.values(),
                   *run.ceilings.values()]:  # fmt: skip
        if errors(result):
            examples = "; ".join(result.client["error_examples"])
            lines.append(f"- {result.leg}, N={result.streams:,}: {examples}")
    return lines


def render(run: Run) -> str:
    """The whole report."""
    out = [*run.header, "", "## Ladder", "", *ladder_rows(run), ""]
    out += [f"Largest N held with added gap p99 ≤ {GAP_TARGET_MS:g} ms and no error:", ""]
    out += [*holds(run), ""]
    if run.storms:
        out += ["## Disconnect storm", "", *storm_rows(run), ""]
    if run.ceilings:
        out += ["## Many slow streams", "", *ceiling_rows(run), ""]
    if run.stops:
        out += ["## Clients that stop reading", "", *stop_rows(run), ""]
    failures = error_lines(run)
    if failures:
        out += ["## Errors seen", "", *failures, ""]
    if run.skipped:
        out += ["## Not measured", ""]
        out += [f"- {leg}: {why}" for leg, why in run.skipped.items()]
        out.append("")
    if run.notes:
        out += ["## Notes", "", *run.notes, ""]
    return "\n".join(out)
