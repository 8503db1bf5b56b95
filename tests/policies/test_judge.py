"""The judge call's fixed rubric and the parsing of its verdict."""

from __future__ import annotations

import pytest

from policies.judge import MAX_PART_CHARS, RUBRIC, judge_messages, parse_score


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("SCORE: 5", 1.0),
        ("score:1", 0.0),
        ("The candidate misses a step.\nSCORE: 3", 0.5),
        ("SCORE: 4 because", 0.75),
        ("SCORE: 6", None),
        ("SCORE: <1-5>", None),
        ("I think it is fine", None),
        ("", None),
    ],
)
def test_parse_score_maps_one_to_five_onto_zero_to_one(reply: str, score: float | None) -> None:
    """Only ``SCORE: n`` with n in 1..5 is a verdict; anything else is None, never a guess."""
    assert parse_score(reply) == score


def test_messages_carry_the_rubric_and_clip_long_texts() -> None:
    """The rubric is the system message; question, reference and candidate are clipped."""
    messages = judge_messages("Q?", "R" * (MAX_PART_CHARS + 50), "C")
    assert messages[0] == {"role": "system", "content": RUBRIC}
    user = messages[1]["content"]
    assert user.startswith("QUESTION:\nQ?\n\nREFERENCE:\n")
    assert user.endswith("\n\nCANDIDATE:\nC")
    assert "R" * MAX_PART_CHARS + " [...]" in user
    assert "R" * (MAX_PART_CHARS + 1) not in user
