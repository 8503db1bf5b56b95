"""The scorer A/B's report: medians over rounds, ratios to the first revision, round order."""

from __future__ import annotations

from bench.classify.ab import report


def point(p50: float, mean: float) -> dict[str, float]:
    """One process's summary (p99 is not reported)."""
    return {"p50": p50, "p90": 2 * p50, "p99": 3 * p50, "mean": mean}


def test_report_takes_medians_over_rounds_and_ratios_to_the_first_revision() -> None:
    """Three rounds: the medians ignore the one slow round of each revision, and every round
    is listed in the order it ran (reversed in even rounds)."""
    rounds = [
        {"a": point(100, 110), "b": point(90, 99)},
        {"a": point(180, 200), "b": point(95, 100)},
        {"a": point(104, 112), "b": point(170, 190)},
    ]
    text = report(["a", "b"], rounds, "# head")
    assert "| a | 104.0 | 208.0 | 112.0 | 1.000 | 1.000 |" in text
    assert "| b | 95.0 | 190.0 | 100.0 | 0.913 | 0.893 |" in text
    assert "- round 2: b 95.0 / 190.0 / 100.0; a 180.0 / 360.0 / 200.0" in text
    assert text.startswith("# head\n")
