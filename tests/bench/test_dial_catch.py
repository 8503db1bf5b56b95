"""The dial-catch benchmark's arithmetic: the threshold at the top share, and 25 %-complex draws."""

from __future__ import annotations

import random

from bench.classify.dial_catch import caught, draw


def test_caught_counts_complex_rows_at_or_above_the_top_share() -> None:
    """Ten rows, share 0.3: the threshold is the third-highest score (0.8); of the four complex
    rows, 0.9 and 0.8 reach it."""
    scores = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    labels = [1, 0, 1, 0, 1, 0, 0, 1, 0, 0]
    assert caught(scores, labels, 0.3) == 0.5


def test_a_draw_holds_the_asked_complex_share_and_no_row_twice() -> None:
    """100 complex and 120 simple rows at 25 %: 40 complex against 120 simple."""
    rows = [(0.5, 1)] * 100 + [(0.5, 0)] * 120
    picked = draw(rows, random.Random(1), 0.25)
    assert len(picked) == len(set(picked)) == 160
    assert sum(rows[i][1] for i in picked) == 40
