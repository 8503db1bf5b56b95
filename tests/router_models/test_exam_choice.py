# ruff: noqa: RUF001 - the Chinese and Japanese text uses full-width punctuation
"""Tests for router_models/corpus/exam_choice.py (router round 17): each calculation template's
right option is the answer recomputed here by an independent formula, every question shows four
distinct options with the right one among them, recall and calculation questions draw their
leads, layouts and answer instructions from the same pools, and each language's text is in
that language."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from fractions import Fraction
from random import Random

import pytest

from router_models.corpus import exam_choice
from router_models.corpus.exam_choice import CALCS, LANGUAGES, Slots, calculation, question, recall
from router_models.corpus.lexicon import phrases

DRAWS = 400


def _v(s: Slots, key: str) -> float:
    value = s[key]
    assert not isinstance(value, str)
    return float(value)


def _pairs(at_least: float) -> Fraction:
    return Fraction(sum(1 for a in range(1, 7) for b in range(1, 7) if a + b >= at_least), 36)


def _positive_root(equation: str) -> float:
    match = re.fullmatch(r"x² ([+−]) (\d*)x − (\d+) = 0", equation)
    assert match, equation
    b = (1 if match[1] == "+" else -1) * int(match[2] or 1)
    c = -int(match[3])
    return (-b + math.sqrt(b * b - 4 * c)) / 2


def _compound(start: float, rate: float, years: int) -> float:
    value = start
    for _ in range(years):
        value += value * rate
    return value


# Each template's answer, written again from its question's wording (not from the module).
EXPECTED: dict[str, Callable[[Slots], float | Fraction]] = {
    "accelerated_distance": lambda s: _v(s, "a") * _v(s, "t") ** 2 / 2,
    "average_speed": lambda s: (
        (_v(s, "d1") + _v(s, "d2")) / (_v(s, "d1") / _v(s, "v1") + _v(s, "d2") / _v(s, "v2"))
    ),
    "series_power": lambda s: _v(s, "v") ** 2 * _v(s, "r1") / (_v(s, "r1") + _v(s, "r2")) ** 2,
    "parallel_current": lambda s: _v(s, "v") / _v(s, "r1") + _v(s, "v") / _v(s, "r2"),
    "heating_water": lambda s: 4.2 * _v(s, "m") * (_v(s, "t2") - _v(s, "t1")),
    "free_fall_speed": lambda s: math.sqrt(19.6 * _v(s, "h")),
    "inelastic_collision": lambda s: (
        _v(s, "m1") * _v(s, "v1") / (_v(s, "m1") + _v(s, "m2"))
    ),
    "lifting_power": lambda s: _v(s, "m") * 9.8 * _v(s, "h") / _v(s, "t"),
    "molarity": lambda s: _v(s, "mass") / _v(s, "M") * 1000 / _v(s, "V"),
    "dilution": lambda s: _v(s, "c1") * _v(s, "v1") / _v(s, "v2"),
    "gas_volume": lambda s: _v(s, "mass") / _v(s, "M") * 22.4,
    "limestone_co2": lambda s: _v(s, "m") / (40 + 12 + 3 * 16) * (12 + 2 * 16),
    "variance": lambda s: statistics.pvariance([int(x) for x in str(s["data"]).split(", ")]),
    "mean_after_adding": lambda s: (_v(s, "k") + 1) * _v(s, "m2") - _v(s, "k") * _v(s, "m"),
    "weighted_grade": lambda s: (
        sum(_v(s, f"w{i}") * _v(s, f"s{i}") for i in (1, 2, 3)) / 100
    ),
    "dice_at_least": lambda s: _pairs(_v(s, "k")),
    "two_red_balls": lambda s: Fraction(
        math.comb(int(_v(s, "r")), 2), math.comb(int(_v(s, "r") + _v(s, "b")), 2)
    ),
    "at_least_one_six": lambda s: 1 - (5 / 6) ** _v(s, "k"),
    "coin_heads": lambda s: Fraction(
        math.comb(int(_v(s, "k")), int(_v(s, "h"))), 2 ** int(_v(s, "k"))
    ),
    "linear_system": lambda s: (_v(s, "t") - _v(s, "b") * _v(s, "s")) / (_v(s, "a") - _v(s, "b")),
    "quadratic_root": lambda s: _positive_root(str(s["eq"])),
    "arithmetic_series": lambda s: sum(
        _v(s, "a") + i * _v(s, "d") for i in range(int(_v(s, "k")))
    ),
    "compound_interest": lambda s: _compound(_v(s, "p"), _v(s, "r") / 100, int(_v(s, "k"))),
    "depreciation": lambda s: _compound(_v(s, "p"), -_v(s, "r") / 100, int(_v(s, "k"))),
    "right_triangle_perimeter": lambda s: (
        _v(s, "a") + _v(s, "b") + math.hypot(_v(s, "a"), _v(s, "b"))
    ),
    "cylinder_volume": lambda s: 3.14 * _v(s, "r") ** 2 * _v(s, "h"),
    "sector_area": lambda s: 3.14 * _v(s, "r") ** 2 * _v(s, "deg") / 360,
    "half_life": lambda s: _v(s, "m") * 0.5 ** (_v(s, "total") / _v(s, "t")),
    "price_change": lambda s: _v(s, "p") * (1 + _v(s, "u") / 100) * (1 - _v(s, "d") / 100),
}  # fmt: skip
PROBABILITIES = {"dice_at_least", "two_red_balls", "at_least_one_six", "coin_heads"}


def _number(option: str) -> float | Fraction:
    digits = re.search(r"-?\d+(?:\.\d+)?(?:/\d+)?", option)
    assert digits, option
    text = digits[0]
    return Fraction(text) if "/" in text else float(text)


def _script(text: str) -> str:
    if any("\u3040" <= ch <= "\u30ff" for ch in text):
        return "ja"
    return "zh" if any("\u4e00" <= ch <= "\u9fff" for ch in text) else "en"


def test_templates_and_recall_items_are_as_many_as_the_round_claims() -> None:
    """At least 25 calculation templates, each with a stem in all three languages and an
    independent check here; at least 60 recall items per language, four distinct options each."""
    assert len(CALCS) >= 25
    assert len({c.name for c in CALCS}) == len(CALCS)
    assert {c.name for c in CALCS} == set(EXPECTED)
    for calc in CALCS:
        assert set(calc.stems) == set(LANGUAGES) == set(calc.unit)
    for language in LANGUAGES:
        items = phrases(f"exam_recall_{language}")
        assert len(items) >= 60
        assert len({item.split(" | ")[0] for item in items}) == len(items)
        for item in items:
            parts = item.split(" | ")
            assert len(parts) == 5, item
            assert len(set(parts[1:])) == 4, item


@pytest.mark.parametrize("language", LANGUAGES)
def test_calculation_answers_are_correct_and_sensible(language: str) -> None:
    """The right option of every template equals the independently recomputed answer (to the
    rounding shown), is positive, and a probability lies in (0, 1]; the options are four and
    distinct, and every wrong option is positive too (no negative lengths, prices or
    probabilities above 1)."""
    seen = set()
    for i in range(DRAWS * len(CALCS) // 4):
        calc, slots, q = calculation(Random(i), language)
        seen.add(calc.name)
        assert len(set(q.options)) == 4, q
        right = _number(q.options[q.answer])
        expected = EXPECTED[calc.name](slots)
        if isinstance(expected, Fraction):
            assert right == expected, (calc.name, slots, q)
        else:
            assert abs(float(right) - expected) <= 0.5 * 10**-calc.places + 1e-9, (
                calc.name,
                slots,
                q,
            )
        for option in q.options:
            value = float(_number(option))
            assert value > 0, (calc.name, q)
            if calc.name in PROBABILITIES:
                assert value <= 1, (calc.name, q)
        assert "{" not in q.stem
        assert "}" not in q.stem
    assert seen == set(EXPECTED)


@pytest.mark.parametrize("language", LANGUAGES)
def test_recall_questions_show_the_right_fact_among_four_options(language: str) -> None:
    """A recall question shows its item's four options, shuffled, with the item's right answer
    at ``answer``."""
    items = {
        item.split(" | ")[0]: item.split(" | ")[1:] for item in phrases(f"exam_recall_{language}")
    }
    for i in range(DRAWS):
        q = recall(Random(i), language)
        right, *wrong = items[q.stem]
        assert q.options[q.answer] == right
        assert sorted(q.options) == sorted([right, *wrong])


def _layout_pattern(layout: str) -> re.Pattern[str]:
    pattern = re.escape(layout)
    for k in range(4):
        pattern = pattern.replace(re.escape(f"{{{k}}}"), r"[^\n]+?")
    return re.compile(pattern)


@pytest.mark.parametrize("language", LANGUAGES)
def test_both_labels_use_the_same_leads_layouts_and_instructions(language: str) -> None:
    """Over many draws, recall (simple) and calculation (complex) questions use every lead,
    option layout and answer instruction of the language's pools, and nothing else: the
    packaging carries no label."""
    leads = [
        re.escape(lead).replace(r"\{n\}", r"\d+").replace(r"\{p\}", r"\d+")
        for lead in exam_choice.LEADS[language]
    ]
    layouts = exam_choice.LAYOUTS[language]
    used: dict[str, tuple[set[str], set[str], set[str]]] = {}
    for kind in ("recall", "calculation"):
        found: tuple[set[str], set[str], set[str]] = (set(), set(), set())
        for i in range(DRAWS * 2):
            rng = Random(i)
            text = question(rng, language, kind)
            starts = [lead for lead in leads if lead and re.match(lead, text)]
            found[0].add(starts[0] if starts else "")
            matched = [layout for layout in layouts if _layout_pattern(layout).search(text)]
            assert len(matched) == 1, text
            found[1].add(matched[0])
            ends = [
                ins
                for ins in exam_choice.INSTRUCTIONS[language]
                if ins and text.endswith("\n" + ins)
            ]
            found[2].add(ends[0] if ends else "")
        used[kind] = found
    assert used["recall"] == used["calculation"]
    assert used["recall"][0] == set(leads)
    assert used["recall"][1] == set(layouts)
    assert used["recall"][2] == set(exam_choice.INSTRUCTIONS[language])


@pytest.mark.parametrize("language", LANGUAGES)
def test_questions_are_in_the_language_claimed(language: str) -> None:
    """English stems have no Han or kana, Chinese stems have Han and no kana, Japanese stems
    have kana; likewise each language's leads and instructions."""
    stems = [item.split(" | ")[0] for item in phrases(f"exam_recall_{language}")]
    stems += [calc.stems[language] for calc in CALCS]
    for stem in stems:
        assert _script(stem) == language, stem
    for extra in (*exam_choice.LEADS[language], *exam_choice.INSTRUCTIONS[language]):
        if extra and language == "en":
            assert _script(extra) == "en", extra
        elif extra:  # a Chinese lead may be a bare number; every Japanese one has kana or kanji
            assert _script(extra) != "ja" if language == "zh" else _script(extra) != "en", extra


def test_the_same_seed_gives_the_same_questions() -> None:
    """A question is a function of the RNG state alone."""
    for kind in ("recall", "calculation"):
        for language in LANGUAGES:
            assert question(Random(7), language, kind) == question(Random(7), language, kind)
