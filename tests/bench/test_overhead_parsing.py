"""Smoke tests of the overhead benchmark's parsing and reporting (no servers, no wrk)."""

from __future__ import annotations

import pytest

from bench.harness.points import Series
from bench.harness.wrk import JSON_MARK, WrkResult, lua_script, parse_output
from bench.overhead.report import MemorySample, Report, checks, render
from bench.overhead.run import make_plan, parse_args

WRK_STDOUT = f"""Running 3s test @ http://127.0.0.1:8000/v1/chat/completions
  1 threads and 16 connections
  Latency Distribution
     50%  500.00us
  6000 requests in 3.00s, 2.00MB read
Requests/sec:   2000.00
{JSON_MARK}{{"requests": 6000, "duration_us": 3000000, "connect": 0, "read": 1, "write": 0, \
"status": 2, "timeout": 3, "p50_us": 500, "p90_us": 900, "p99_us": 2500, "mean_us": 610.5}}
"""


def _point(rps: float, p50_ms: float) -> WrkResult:
    return WrkResult(int(rps * 10), 10.0, 0, 0, p50_ms, p50_ms * 2, p50_ms * 4, p50_ms)


def test_parse_output_reads_the_done_hook_line() -> None:
    """The WRK_JSON line gives requests, rate, error counts and percentiles in ms."""
    result = parse_output(WRK_STDOUT)
    assert result.requests == 6000
    assert result.rps == pytest.approx(2000.0)
    assert (result.errors, result.non_2xx) == (4, 2)
    assert (result.p50_ms, result.p99_ms) == (0.5, 2.5)


def test_parse_output_without_the_line_raises() -> None:
    """Output without the machine-readable line is an error, not a zero result."""
    with pytest.raises(ValueError, match="WRK_JSON"):
        parse_output("Requests/sec: 10\n")


def test_lua_script_escapes_body_and_adds_optional_parts() -> None:
    """The body is a valid Lua string; the key and the stop hook appear only when asked."""
    plain = lua_script({"content": 'say "hi"'}, None)
    assert '\\"content\\":\\"say \\\\\\"hi\\\\\\"\\"' in plain
    assert "Authorization" not in plain
    assert "wrk.thread:stop()" not in plain
    keyed = lua_script({}, "sk-1", stop_after=50)
    assert 'wrk.headers["Authorization"] = "Bearer sk-1"' in keyed
    assert "local stop_after = 50" in keyed
    assert "wrk.thread:stop()" in keyed


def test_checks_compare_each_target() -> None:
    """Ratios, added latency, collapse and memory growth each pass or fail on their target."""
    report = Report("t", "cmd", [])
    report.series = [
        Series(
            "direct", "up", {1: _point(9000, 0.05), 16: _point(20000, 0.2), 64: _point(20000, 1)}
        ),
        Series("tiergate", "tg", {1: _point(1500, 0.6), 16: _point(2000, 5), 64: _point(1500, 20)}),
        Series("litellm", "ll", {1: _point(60, 15), 16: _point(100, 200), 64: _point(100, 700)}),
    ]
    report.memory = [MemorySample(20_000, 60.0), MemorySample(200_000, 63.0)]
    verdicts = {c.name: c.passed for c in checks(report)}
    assert verdicts["TierGate / LiteLLM req/s at c=16"] is True
    assert verdicts["TierGate / LiteLLM req/s at c=64"] is True
    assert verdicts["TierGate added p50 at c=1"] is True
    assert verdicts["TierGate req/s c=64 / c=16"] is False
    assert verdicts["TierGate RSS growth, last vs first"] is True


def test_render_marks_missing_legs_not_measured() -> None:
    """A run without LiteLLM renders n/a for its checks and says why it is missing."""
    report = Report("t", "cmd", ["env"])
    report.series = [Series("tiergate", "tg", {16: _point(2000, 5)})]
    report.unavailable["LiteLLM"] = "pip install failed\nmore"
    text = render(report)
    assert "| tg | 16 | 2,000 |" in text
    assert "| TierGate / LiteLLM req/s at c=16 | not measured | ≥ 10.00x | n/a |" in text
    assert "- LiteLLM: pip install failed" in text


def test_memory_only_report_has_only_the_memory_phase() -> None:
    """``--memory-only``: no throughput table, and only the memory checks, judged."""
    report = Report("t", "cmd", ["env"], variant="full", memory_only=True)
    report.memory = [MemorySample(20_000, 100.0, 20.0), MemorySample(200_000, 109.0, 200.0)]
    assert [c.name for c in checks(report)] == ["TierGate RSS growth, last vs first"]
    assert checks(report)[0].passed is True
    text = render(report)
    assert "| setup | c | req/s" not in text
    assert "| 200,000 | 109.0 | 200 |" in text
    report.memory[-1] = MemorySample(200_000, 111.0, 200.0)
    assert checks(report)[0].passed is False


def test_memory_steps_default_to_20k_then_200k() -> None:
    """The memory phase reads RSS at 20k and 200k requests unless told otherwise."""
    assert make_plan(parse_args([])).memory_steps == (20_000, 200_000)
    args = parse_args(["--memory-only", "--memory-requests", "20000,100000,200000"])
    assert args.memory_only
    assert make_plan(args).memory_steps == (20_000, 100_000, 200_000)
