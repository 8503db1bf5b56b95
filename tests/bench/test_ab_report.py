"""bench/overhead/ab.py's report: medians per revision, ratios to the first, every round."""

from __future__ import annotations

import argparse

from bench.overhead.ab import Point, report


def test_report_takes_medians_and_ratios_against_the_first_revision() -> None:
    """Three rounds: the middle value wins; the base's CPU ratio is 1."""
    args = argparse.Namespace(variant="full", rounds=3, duration=5.0, concurrency=16)
    points = {
        "aaa1111": [
            Point(1000, 900, 1.0, 3.0),
            Point(1200, 800, 0.9, 2.0),
            Point(1100, 1000, 2.0, 4.0),
        ],
        "bbb2222": [
            Point(1300, 700, 0.8, 1.5),
            Point(1250, 720, 0.7, 2.5),
            Point(900, 1100, 1.9, 9.0),
        ],
    }
    text = report(args, ["aaa1111", "bbb2222"], points)
    assert "| aaa1111 | 1,100 | 900 | 1.000 | 3.000 | 1.000 |" in text
    assert "| bbb2222 | 1,250 | 720 | 0.800 | 2.500 | 0.800 |" in text
    assert "| 3 | bbb2222 | 900 | 1,100 | 1.900 | 9.000 |" in text
    assert "variant `full`" in text
