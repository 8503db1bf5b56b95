"""Answer agreement: exact match for short answers, JSON compare, F1 + LCS for text."""

from __future__ import annotations

import json

import pytest

from gateway.upstream.attempt import choice_text
from policies.agreement import (
    agreement,
    lcs_ratio,
    normalize,
    readable,
    token_f1,
    tool_call_text,
)


def test_normalization_ignores_case_punctuation_and_articles() -> None:
    """'The Eiffel Tower.' and 'eiffel tower' are the same short answer."""
    assert normalize("The  Eiffel Tower.") == "eiffel tower"
    result = agreement("The Eiffel Tower.", "eiffel tower")
    assert (result.score, result.method) == (1.0, "exact")


def test_short_answers_are_all_or_nothing() -> None:
    """'42' vs '41' disagree completely."""
    assert agreement("42", "41").score == 0.0


def test_json_answers_are_parsed_and_compared_by_leaf() -> None:
    """Key order and fences do not matter; one differing leaf of four costs a quarter."""
    a = '{"name": "Ada", "age": 36, "tags": ["x", "y"]}'
    b = '```json\n{"tags": ["x", "y"], "age": 36, "name": "ada"}\n```'
    assert agreement(a, b).score == 1.0
    c = '{"name": "Ada", "age": 37, "tags": ["x", "y"]}'
    result = agreement(a, c)
    assert result.method == "json"
    assert result.score == pytest.approx(0.75)


def test_invalid_json_against_valid_json_is_a_disagreement() -> None:
    """Strict output that does not parse scores 0 against one that does."""
    assert agreement('{"a": 1}', '{"a": 1').score == 0.0


def test_text_answers_use_f1_and_lcs() -> None:
    """Same words in another order agree on F1 but not fully on LCS."""
    a = "first boil the water then add the pasta and salt"
    b = "add the pasta and salt then first boil the water"
    result = agreement(a, b)
    assert result.method == "text"
    assert 0.5 < result.score < 1.0
    assert agreement(a, a).score == 1.0
    assert agreement(a, "completely unrelated words about astronomy here").score < 0.1


def test_f1_and_lcs_edge_cases() -> None:
    """Empty inputs and long inputs are handled."""
    assert token_f1([], []) == 1.0
    assert token_f1(["a"], []) == 0.0
    assert lcs_ratio([], ["a"]) == 0.0
    long = ["w"] * 5000
    assert lcs_ratio(long, long) == 1.0


def test_tool_calls_are_compared_by_name_and_parsed_arguments() -> None:
    """Two calls of one function with the same arguments (spaced differently) agree; another
    argument value halves it; a call against words, or two empty answers, do not agree."""
    paris = tool_call_text("get_weather", '{"city": "Paris", "unit": "c"}')
    assert (
        agreement(paris, tool_call_text("get_weather", '{"unit":"c","city":"Paris"}')).score == 1.0
    )
    other = agreement(paris, tool_call_text("get_weather", '{"city": "Rome", "unit": "c"}'))
    assert other.method == "tool_calls"
    assert other.score == pytest.approx(2 / 3)
    assert agreement(paris, "It is sunny in Paris today, about 20 degrees.").score == 0.0
    assert agreement("", " ").method == "empty"


def test_the_judge_reads_a_tool_call_as_words() -> None:
    """What the judge is shown of a call: a line of its own, no control characters."""
    text = "Checking." + tool_call_text("get_weather", '{"city": "Paris"}')
    assert readable(text) == 'Checking.\n[tool call] get_weather {"city": "Paris"}'


def test_a_streamed_tool_call_reads_as_the_whole_one() -> None:
    """The pieces of a streamed call (name first, then argument fragments), joined, are the
    text of the same call in a whole answer."""
    chunks = [
        {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]
    pieces = [
        choice_text(json.dumps({"choices": [{"delta": d}]}).encode(), "delta") for d in chunks
    ]
    message = {
        "content": None,
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    whole = choice_text(json.dumps({"choices": [{"message": message}]}).encode(), "message")
    assert "".join(p or "" for p in pieces) == whole == tool_call_text("f", '{"a": 1}')
