"""The metric definitions of ``loadgen.metrics`` (those of ``vllm bench serve``)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from loadgen.client import RequestResult
from loadgen.metrics import distribution, meets, summarise, trimmed_mean
from loadgen.progress import Progress
from loadgen.spec import Slo


def _ok(ttft: float, e2el: float, tokens: int, source: str = "usage") -> RequestResult:
    gaps = [(e2el - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return RequestResult(
        ok=True,
        status="200",
        ttft=ttft,
        e2el=e2el,
        itl=gaps,
        output_tokens=tokens,
        counted_from=source,
    )


def test_tpot_excludes_the_first_token() -> None:
    """TPOT is (E2E - TTFT) / (output tokens - 1), and undefined below two tokens."""
    assert _ok(0.1, 1.1, 11).tpot == pytest.approx(0.1)
    assert _ok(0.1, 0.1, 1).tpot is None


def test_distribution_in_milliseconds_with_numpy_percentiles() -> None:
    """mean, median, p90, p99 and std are numpy's (linear percentiles), in ms."""
    seconds = [0.001 * v for v in range(1, 101)]
    stats = distribution(seconds, 0.05)
    ms = np.arange(1, 101, dtype=float)
    assert stats["count"] == 100
    assert stats["mean"] == pytest.approx(50.5)
    assert stats["median"] == pytest.approx(50.5)
    assert stats["p90"] == pytest.approx(float(np.percentile(ms, 90)))
    assert stats["p99"] == pytest.approx(float(np.percentile(ms, 99)))
    assert stats["std"] == pytest.approx(float(ms.std()))


def test_distribution_of_nothing_is_none() -> None:
    """No samples: every statistic is None, not zero."""
    stats = distribution([], 0.05)
    assert stats["count"] == 0
    assert stats["median"] is None
    assert stats["trimmed_mean"] is None


def test_trimmed_mean_drops_both_tails() -> None:
    """A 10 % trim of 10 values drops the smallest and the largest."""
    values = [1.0, 2, 3, 4, 5, 6, 7, 8, 9, 1000]
    assert trimmed_mean(values, 0.1) == pytest.approx(5.5)
    assert trimmed_mean(values, 0.0) == pytest.approx(sum(values) / 10)
    assert trimmed_mean([3.0], 0.4) == 3.0


def test_goodput_counts_requests_within_every_limit() -> None:
    """A request is good only when TTFT, TPOT and E2E are all within the SLO."""
    slo = Slo(ttft_ms=100, tpot_ms=20)
    assert meets(_ok(0.05, 0.5, 31), slo)
    assert not meets(_ok(0.15, 0.5, 31), slo)  # TTFT too slow
    assert not meets(_ok(0.05, 1.5, 31), slo)  # TPOT ~48 ms
    assert meets(_ok(0.05, 0.05, 1), slo)  # one token: TPOT does not apply
    assert not meets(RequestResult(ok=False, status="503"), slo)


def test_summary_throughput_errors_and_goodput() -> None:
    """Throughput counts successful requests only; errors are grouped by status."""
    results = [
        _ok(0.05, 0.5, 10),
        _ok(0.2, 0.6, 10),
        RequestResult(status="503", error="busy"),
        RequestResult(status="connect", error="refused"),
        RequestResult(status="503", error="busy again"),
    ]
    summary = summarise(results, 2.0, Slo(ttft_ms=100), 0.0)
    assert summary["completed"] == 2
    assert summary["error_rate"] == pytest.approx(0.6)
    assert summary["errors_by_status"] == {"503": 2, "connect": 1}
    assert summary["first_errors"] == {"503": "busy", "connect": "refused"}
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["output_throughput"] == pytest.approx(10.0)
    assert summary["goodput"] == pytest.approx(0.5)
    assert summary["ttft_ms"]["median"] == pytest.approx(125.0)
    assert summary["itl_ms"]["count"] == 18


def test_summary_says_where_token_counts_came_from() -> None:
    """usage, chunks or mixed, from the successful requests."""
    assert summarise([_ok(0.1, 1, 5)], 1, Slo(), 0)["tokens_counted_from"] == "usage"
    assert summarise([_ok(0.1, 1, 5, "chunks")], 1, Slo(), 0)["tokens_counted_from"] == "chunks"
    mixed = [_ok(0.1, 1, 5), _ok(0.1, 1, 5, "chunks")]
    assert summarise(mixed, 1, Slo(), 0)["tokens_counted_from"] == "mixed"
    assert "goodput" not in summarise(mixed, 1, Slo(), 0)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_on_a_terminal_and_keeps_point_lines() -> None:
    """On a terminal the bar is redrawn in place; each finished point leaves one line."""
    screen = _Terminal()
    progress = Progress(4, screen)
    progress.begin("direct 128/32 c=1 rate=inf")
    for _ in range(4):
        progress.step()
    progress.end_point("4/4 ok")
    text = screen.getvalue()
    assert "\r\x1b[2K[########################] 4/4" in text
    assert text.endswith("direct 128/32 c=1 rate=inf: 4/4 ok\n")
    plain = io.StringIO()
    quiet = Progress(1, plain)
    quiet.begin("x")
    quiet.step()
    quiet.end_point("1/1 ok")
    assert plain.getvalue() == "x: 1/1 ok\n"
