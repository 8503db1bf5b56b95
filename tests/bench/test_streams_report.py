"""The streams benchmark's arithmetic: percentiles, gaps, added values and the report."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.streams.report import (
    Run,
    holds,
    ladder_rows,
    render,
    rss_per_stream,
    stop_rows,
    storm_rows,
)
from bench.streams.stats import added, delays_ms, gaps_ms, per_thousand, percentile, summary
from bench.streams.wave import WaveResult, abort_summary


def test_percentile_is_nearest_rank() -> None:
    """p50 of 1..100 is 50, p99 is 99, p100 the maximum; one value is every percentile."""
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 1) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="outside"):
        percentile(values, 101)


def test_gaps_and_delays_in_milliseconds() -> None:
    """Gaps are differences of consecutive arrivals; delays are arrival minus the write stamp."""
    arrivals = [1_000_000, 21_000_000, 41_500_000]
    assert gaps_ms(arrivals) == [20.0, 20.5]
    assert gaps_ms(arrivals[:1]) == []
    assert delays_ms(arrivals, [900_000, 20_000_000, 41_000_000]) == [0.1, 1.0, 0.5]


def test_summary_added_and_per_thousand() -> None:
    """A leg's p50/p99/max minus direct's; CPU-seconds per 1,000 events."""
    leg = summary([50.0] * 98 + [60.0, 90.0])
    direct = summary([50.0] * 99 + [52.0])
    assert leg == {"n": 100.0, "p50": 50.0, "p99": 60.0, "max": 90.0}
    assert added(leg, direct) == {"p50": 0.0, "p99": 10.0, "max": 38.0}
    assert per_thousand(0.5, 10_000) == 0.05
    assert math.isnan(per_thousand(1.0, 0))


def wave(leg: str, streams: int, gap_p99: float, errors: int = 0, **extra: Any) -> WaveResult:
    """A wave result with the given gap p99 and error count (other numbers fixed)."""
    stats = {"n": 10.0, "p50": 1.0, "p99": 2.0, "max": 3.0}
    client = {
        "events": streams * 10, "errors": {"HTTP 503": errors} if errors else {},
        "error_examples": ["HTTP 503"] if errors else [], "events_per_s": 100.0,
        "ttft_ms": stats, "gap_ms": {**stats, "p99": gap_p99}, "delay_ms": stats,
        "hangups": extra.pop("hangups", []),
    }  # fmt: skip
    fields: dict[str, Any] = {
        "leg": leg, "streams": streams, "client": client, "wall_s": 2.0, "cpu_s": 1.0,
        "upstream_cpu_s": 0.2, "upstream_events": streams * 10, "rss_before_kib": 2048,
        "rss_peak_kib": 2048 + streams * 20, "rss_after_kib": 2048, "accept_queue_max": 3,
        "load1": 1.5, "rss_start_kib": 2048,
    }  # fmt: skip
    fields.update(extra)
    return WaveResult(**fields)


def test_ladder_rows_show_what_the_proxy_added_over_direct() -> None:
    """A proxy row carries its own numbers and the difference from direct at the same N."""
    run = Run(["# t"])
    run.ladder["direct"] = [wave("direct", 100, 52.0)]
    run.ladder["nginx"] = [wave("nginx", 100, 55.5)]
    rows = ladder_rows(run)
    assert "| direct | 100 |" in rows[2]
    assert "1.0 / 55.5 / 3.0 (+0.0 / +3.5 / +0.0)" in rows[3]
    assert "1.000 (50 %)" in rows[3]  # 1 CPU-s over 1,000 events, over a 2 s wave
    assert rss_per_stream(run.ladder["nginx"][0]) == 20.0


def test_holds_is_the_largest_n_with_a_small_added_gap_and_no_error() -> None:
    """N=1000 adds 20 ms and N=2000 has errors, so the leg holds 100."""
    run = Run(["# t"])
    run.ladder["direct"] = [wave("direct", n, 52.0) for n in (100, 1000, 2000)]
    run.ladder["tg"] = [wave("tg", 100, 55.0), wave("tg", 1000, 72.0),
                        wave("tg", 2000, 53.0, errors=4)]  # fmt: skip
    assert holds(run) == ["- tg: 100"]
    assert "tg, N=2,000: HTTP 503" in render(run)


def test_storm_counts_aborts_within_a_second_and_those_never_aborted() -> None:
    """Each hung-up stream is matched by id to the upstream's close time."""
    second = 1_000_000_000
    hangups = [[0, 10 * second], [2, 10 * second], [4, 10 * second]]
    aborts = [(0, 10 * second + 5_000_000), (2, 12 * second)]
    result = wave("tg", 6, 52.0, hangups=hangups, aborts=aborts)
    stats = abort_summary(result)
    assert (stats["hung_up"], stats["within_1s"], stats["never_aborted"]) == (3, 1, 1)
    assert stats["max"] == 2000.0
    run = Run(["# t"])
    run.storms["tg"] = result
    assert "| tg | 6 | 3 | 1 | 5.0 / 2,000.0 / 2,000.0 | 1 | 0 |" in storm_rows(run)[2]


def test_a_storm_control_wave_with_errors_is_reported_like_every_other_wave() -> None:
    """The control wave (the storm's shape, nobody hangs up) is a wave of its own: its errors
    are listed, so a control that failed cannot pass unseen under the storm's numbers."""
    run = Run(["# t"])
    run.storm_controls["tg"] = wave("tg control", 1000, 52.0, errors=2)
    run.storms["tg"] = wave("tg", 1000, 52.0)
    assert "tg control, N=1,000: HTTP 503" in render(run)


def test_stop_rows_compare_the_others_gaps_and_count_how_stopped_streams_ended() -> None:
    """The control wave's and the stop wave's gaps side by side, the move of p99, how the
    stopped streams ended, and RSS every 5 s."""
    control = wave("tg", 100, 60.0)
    control.client["stoppers"] = {"n": 10, "stopped": 0, "complete": 10}
    stopped = wave("tg", 100, 60.5, rss_series=[(5.0, 4096), (6.0, 5000), (10.0, 6144)])
    stopped.client["stoppers"] = {"n": 10, "stopped": 10, "cut": 9, "open": 1}
    run = Run(["# t"])
    run.stops["tg"] = (control, stopped)
    rows = stop_rows(run)
    assert (
        "| tg | 100 | 10 | 1.0 / 60.0 / 3.0 | 1.0 / 60.5 / 3.0 | +0.5 | 0 / 0 | 9 / 0 / 1 |"
        in (rows[2])
    )
    assert rows[-1].endswith("5 s: 4.0, 10 s: 6.0")
    assert "## Clients that stop reading" in render(run)
