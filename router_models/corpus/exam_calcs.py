"""The calculation templates of ``exam_choice`` (router round 17): for each, the slots it
draws, the answer from them and the slips that make its wrong options, with its stems in
English, Chinese and Japanese (``phrases/exam_calc_<language>.txt``). Every template is
written for this project from labelling rule K: its answer needs several computing steps."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from functools import partial
from random import Random
from typing import Final

from router_models.corpus.lexicon import one, phrases

LANGUAGES: Final = ("en", "zh", "ja")
Number = int | float | Fraction
Slots = dict[str, Number | str]

# fmt: off

_SOLUTES: Final = (  # formula, molar mass (g/mol), name in en, zh, ja
    ("NaCl", 58.5, "sodium chloride", "氯化钠", "塩化ナトリウム"),
    ("NaOH", 40, "sodium hydroxide", "氢氧化钠", "水酸化ナトリウム"),
    ("C6H12O6", 180, "glucose", "葡萄糖", "グルコース"),
    ("KCl", 74.5, "potassium chloride", "氯化钾", "塩化カリウム"),
)
_GASES: Final = (
    ("CO2", 44, "carbon dioxide", "二氧化碳", "二酸化炭素"), ("O2", 32, "oxygen", "氧气", "酸素"),
    ("N2", 28, "nitrogen", "氮气", "窒素"), ("CH4", 16, "methane", "甲烷", "メタン"),
)
_TRIPLES: Final = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (9, 40, 41))
_MONEY: Final = {"en": "${}", "zh": "{}元", "ja": "{}万円"}
# fmt: on


@dataclass(frozen=True)
class Calc:
    """A calculation template: slots, the solution from them, and typical slips.

    ``places`` is the rounding of the shown options (a :class:`~fractions.Fraction` answer is
    shown as ``p/q`` and ``places`` is unused); ``low`` < every option < ``high``; ``unit`` per
    language is a format string with ``{}`` for the number; ``stems`` per language are format
    strings over the slots (numbers shown by :func:`show`).
    """

    name: str
    draw: Callable[[Random], Slots]
    solve: Callable[[Slots], Number]
    slips: Callable[[Slots], tuple[Number, ...]]
    places: int
    unit: Mapping[str, str]
    stems: Mapping[str, str]
    low: float = 0.0
    high: float = math.inf


def _n(slots: Slots, key: str) -> float:
    value = slots[key]
    if isinstance(value, str):
        raise TypeError(key)
    return float(value)


def _f(slots: Slots, key: str) -> Fraction:
    value = slots[key]
    if isinstance(value, str):
        raise TypeError(key)
    return Fraction(value)


def show(value: Number | str, places: int = 6) -> str:
    """A number as an exam prints it: rounded half up to ``places``, trailing zeros dropped;
    a fraction as ``p/q``; strings unchanged."""
    if isinstance(value, str):
        return value
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else str(value)
    text = str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _stems(name: str) -> dict[str, str]:
    """Template ``name``'s stem in each language (``phrases/exam_calc_<language>.txt``)."""
    stems = {}
    for language in LANGUAGES:
        lines = (line.split(" | ", 1) for line in phrases(f"exam_calc_{language}"))
        stems[language] = next(stem for key, stem in lines if key == name)
    return stems


def _same(unit: str) -> dict[str, str]:
    return {"en": unit, "zh": unit, "ja": unit}


def _solute(rng: Random) -> Slots:
    formula, molar, en, zh, ja = one(rng, _SOLUTES)
    n = one(rng, (0.05, 0.1, 0.2, 0.25, 0.4, 0.5))
    return {"f": formula, "M": molar, "mass": round(n * molar, 4), "n": n,
            "V": one(rng, (100, 200, 250, 500)), "en": en, "zh": zh, "ja": ja}  # fmt: skip


def _gas(rng: Random) -> Slots:
    formula, molar, en, zh, ja = one(rng, _GASES)
    n = one(rng, (0.25, 0.5, 1.5, 2, 2.5, 3, 4))
    return {"f": formula, "M": molar, "mass": n * molar, "n": n, "en": en, "zh": zh, "ja": ja}


def _legs(rng: Random) -> Slots:
    v1, v2 = 5 * rng.randint(6, 18), 5 * rng.randint(6, 18) + 2  # two different speeds
    t1, t2 = rng.randint(1, 4), rng.randint(1, 4)
    return {"v1": v1, "t1": t1, "d1": v1 * t1, "v2": v2, "t2": t2, "d2": v2 * t2}


def _resistors(rng: Random, volts: tuple[int, ...], top: int) -> Slots:
    r1, r2 = rng.sample(range(2, top + 1), 2)
    return {"v": one(rng, volts), "r1": r1, "r2": r2}


def _tosses(rng: Random) -> Slots:
    n = rng.randint(4, 8)
    return {"k": n, "h": rng.randint(1, n - 1)}


def _decay(rng: Random) -> Slots:
    t, k = rng.randint(2, 30), rng.randint(2, 5)  # the time is a whole number of half-lives
    return {"m": 8 * rng.randint(2, 100), "t": t, "k": k, "total": t * k}


def _scores(rng: Random) -> Slots:
    values = [rng.randint(52, 98) for _ in range(5)]
    values[-1] -= sum(values) % 5  # a whole-number mean
    return {"data": ", ".join(map(str, values)), "data_cjk": "、".join(map(str, values)),
            "mean": sum(values) // 5,
            "var": sum((v - sum(values) // 5) ** 2 for v in values) / 5}  # fmt: skip


def _mean_add(rng: Random) -> Slots:
    n, m = rng.randint(4, 12), rng.randint(10, 80)
    x = rng.randint(n + 1, 200)
    x -= (n * m + x) % (n + 1)  # the new mean is a whole number
    return {"k": n, "m": m, "m2": (n * m + x) // (n + 1), "x": x}


def _weights(rng: Random) -> Slots:
    w1, w2 = one(rng, (20, 25, 30)), one(rng, (20, 25, 30))
    return {"w1": w1, "w2": w2, "w3": 100 - w1 - w2, "s1": rng.randint(55, 98),
            "s2": rng.randint(50, 98), "s3": rng.randint(45, 98)}  # fmt: skip


def _system(rng: Random) -> Slots:
    a, b = rng.sample(range(2, 10), 2)
    x, y = rng.sample(range(1, 31), 2)
    return {"a": a, "b": b, "x": x, "y": y, "s": x + y, "t": a * x + b * y}


def _quadratic(rng: Random) -> Slots:
    r1, r2 = rng.sample(range(1, 16), 2)
    coef = r2 - r1
    sign = "+" if coef > 0 else "−"
    middle = f" {sign} x" if abs(coef) == 1 else f" {sign} {abs(coef)}x"
    return {"r1": r1, "r2": r2, "eq": f"x² {middle.strip()} − {r1 * r2} = 0"}


def _triangle(rng: Random) -> Slots:
    a, b, c = one(rng, _TRIPLES)
    k = rng.randint(1, 4)
    return {"a": a * k, "b": b * k, "c": c * k}


def _pct(slots: Slots, key: str) -> float:
    return _n(slots, key) / 100


CALCS: Final[tuple[Calc, ...]] = (
    Calc(
        "accelerated_distance",
        lambda r: {"a": r.randint(2, 6), "t": r.randint(3, 12)},
        lambda s: 0.5 * _n(s, "a") * _n(s, "t") ** 2,
        lambda s: (
            _n(s, "a") * _n(s, "t") ** 2,
            _n(s, "a") * _n(s, "t"),
            0.5 * _n(s, "a") * _n(s, "t"),
        ),
        1,
        _same("{} m"),
        _stems("accelerated_distance"),
    ),
    Calc(
        "average_speed",
        _legs,
        lambda s: (_n(s, "d1") + _n(s, "d2")) / (_n(s, "t1") + _n(s, "t2")),
        lambda s: (
            (_n(s, "v1") + _n(s, "v2")) / 2,
            (_n(s, "d1") * _n(s, "v1") + _n(s, "d2") * _n(s, "v2")) / (_n(s, "d1") + _n(s, "d2")),
            (_n(s, "d1") + _n(s, "d2")) / (_n(s, "t1") + _n(s, "t2") + 1),
        ),
        1,
        _same("{} km/h"),
        _stems("average_speed"),
    ),
    Calc(
        "series_power",
        partial(_resistors, volts=(6, 9, 12, 24), top=20),
        lambda s: (_n(s, "v") / (_n(s, "r1") + _n(s, "r2"))) ** 2 * _n(s, "r1"),
        lambda s: (
            _n(s, "v") ** 2 / _n(s, "r1"),
            _n(s, "v") / (_n(s, "r1") + _n(s, "r2")) * _n(s, "r1"),
            (_n(s, "v") / (_n(s, "r1") + _n(s, "r2"))) ** 2 * _n(s, "r2"),
        ),
        2,
        _same("{} W"),
        _stems("series_power"),
    ),
    Calc(
        "parallel_current",
        partial(_resistors, volts=(3, 6, 9, 12), top=30),
        lambda s: _n(s, "v") * (_n(s, "r1") + _n(s, "r2")) / (_n(s, "r1") * _n(s, "r2")),
        lambda s: (
            _n(s, "v") / (_n(s, "r1") + _n(s, "r2")),
            _n(s, "v") / _n(s, "r1"),
            _n(s, "v") / _n(s, "r2"),
        ),
        2,
        _same("{} A"),
        _stems("parallel_current"),
    ),
    Calc(
        "heating_water",
        lambda r: {
            "m": r.choice((0.5, 1, 1.5, 2, 2.5, 3)),
            "t1": r.randint(10, 30),
            "t2": r.randint(50, 95),
        },
        lambda s: _n(s, "m") * 4.2 * (_n(s, "t2") - _n(s, "t1")),
        lambda s: (
            _n(s, "m") * 4.2 * _n(s, "t2"),
            4.2 * (_n(s, "t2") - _n(s, "t1")),
            _n(s, "m") * 4.2 * (_n(s, "t2") + _n(s, "t1")),
        ),
        1,
        _same("{} kJ"),
        _stems("heating_water"),
    ),
    Calc(
        "free_fall_speed",
        lambda r: {"h": r.randint(5, 80)},
        lambda s: math.sqrt(2 * 9.8 * _n(s, "h")),
        lambda s: (math.sqrt(9.8 * _n(s, "h")), 2 * _n(s, "h"), 9.8 * _n(s, "h") / 2),
        1,
        _same("{} m/s"),
        _stems("free_fall_speed"),
    ),
    Calc(
        "inelastic_collision",
        lambda r: {
            "m1": 100 * r.randint(8, 20),
            "v1": r.randint(8, 30),
            "m2": 100 * r.randint(6, 20),
        },
        lambda s: _n(s, "m1") * _n(s, "v1") / (_n(s, "m1") + _n(s, "m2")),
        lambda s: (
            _n(s, "v1") / 2,
            _n(s, "m2") * _n(s, "v1") / (_n(s, "m1") + _n(s, "m2")),
            _n(s, "v1") * math.sqrt(_n(s, "m1") / (_n(s, "m1") + _n(s, "m2"))),
        ),
        2,
        _same("{} m/s"),
        _stems("inelastic_collision"),
    ),
    Calc(
        "lifting_power",
        lambda r: {"m": 10 * r.randint(2, 20), "h": r.randint(2, 30), "t": r.randint(4, 60)},
        lambda s: _n(s, "m") * 9.8 * _n(s, "h") / _n(s, "t"),
        lambda s: (
            _n(s, "m") * _n(s, "h") / _n(s, "t"),
            _n(s, "m") * 9.8 * _n(s, "h"),
            _n(s, "m") * 9.8 / _n(s, "t"),
        ),
        1,
        _same("{} W"),
        _stems("lifting_power"),
    ),
    Calc(
        "molarity",
        _solute,
        lambda s: _n(s, "n") / (_n(s, "V") / 1000),
        lambda s: (
            _n(s, "mass") / (_n(s, "V") / 1000),
            _n(s, "n") * _n(s, "V") / 1000,
            _n(s, "mass") / _n(s, "V"),
        ),
        3,
        _same("{} mol/L"),
        _stems("molarity"),
    ),
    Calc(
        "dilution",
        lambda r: {
            "c1": r.choice((0.5, 1, 2, 3, 6)),
            "v1": r.choice((10, 20, 25, 50, 100)),
            "v2": r.choice((250, 500, 1000)),
        },
        lambda s: _n(s, "c1") * _n(s, "v1") / _n(s, "v2"),
        lambda s: (
            _n(s, "c1") * _n(s, "v2") / _n(s, "v1") / 1000,
            _n(s, "c1") * _n(s, "v1") / (_n(s, "v1") + _n(s, "v2")),
            _n(s, "c1") * _n(s, "v1") / _n(s, "v2") * 10,
        ),
        4,
        _same("{} mol/L"),
        _stems("dilution"),
    ),
    Calc(
        "gas_volume",
        _gas,
        lambda s: _n(s, "n") * 22.4,
        lambda s: (_n(s, "mass") * 22.4, _n(s, "mass") / 22.4, 22.4 / _n(s, "n")),
        2,
        _same("{} L"),
        _stems("gas_volume"),
    ),
    Calc(
        "limestone_co2",
        lambda r: {"m": 10 * r.randint(1, 50)},
        lambda s: _n(s, "m") * 44 / 100,
        lambda s: (_n(s, "m") * 56 / 100, _n(s, "m") * 100 / 44, _n(s, "m") * 12 / 100),
        2,
        _same("{} g"),
        _stems("limestone_co2"),
    ),
    Calc(
        "variance",
        _scores,
        lambda s: _n(s, "var"),
        lambda s: (_n(s, "var") * 5 / 4, math.sqrt(_n(s, "var")), _n(s, "var") / 5),
        2,
        _same("{}"),
        _stems("variance"),
    ),
    Calc(
        "mean_after_adding",
        _mean_add,
        lambda s: _n(s, "x"),
        lambda s: (
            _n(s, "m2") * (_n(s, "k") + 1) - _n(s, "m") * (_n(s, "k") - 1),
            2 * _n(s, "m2") - _n(s, "m"),
            _n(s, "m2") * (_n(s, "k") + 1),
        ),
        0,
        _same("{}"),
        _stems("mean_after_adding"),
    ),
    Calc(
        "weighted_grade",
        _weights,
        lambda s: (
            (_n(s, "w1") * _n(s, "s1") + _n(s, "w2") * _n(s, "s2") + _n(s, "w3") * _n(s, "s3"))
            / 100
        ),
        lambda s: (
            (_n(s, "s1") + _n(s, "s2") + _n(s, "s3")) / 3,
            (_n(s, "w1") * _n(s, "s3") + _n(s, "w2") * _n(s, "s2") + _n(s, "w3") * _n(s, "s1"))
            / 100,
            (_n(s, "w1") * _n(s, "s1") + _n(s, "w2") * _n(s, "s2")) / (_n(s, "w1") + _n(s, "w2")),
        ),
        1,
        _same("{}"),
        _stems("weighted_grade"),
    ),
    Calc(
        "dice_at_least",
        lambda r: {"k": r.randint(5, 11)},
        lambda s: Fraction(
            sum(1 for a in range(1, 7) for b in range(1, 7) if a + b >= _n(s, "k")), 36
        ),
        lambda s: (
            Fraction(sum(1 for a in range(1, 7) for b in range(1, 7) if a + b > _n(s, "k")), 36),
            Fraction(sum(1 for a in range(1, 7) for b in range(1, 7) if a + b == _n(s, "k")), 36),
            Fraction(13 - int(_n(s, "k")), 11),
        ),
        0,
        _same("{}"),
        _stems("dice_at_least"),
        high=1,
    ),
    Calc(
        "two_red_balls",
        lambda r: {"r": r.randint(3, 9), "b": r.randint(2, 9)},
        lambda s: (
            _f(s, "r")
            * (_f(s, "r") - 1)
            / ((_f(s, "r") + _f(s, "b")) * (_f(s, "r") + _f(s, "b") - 1))
        ),
        lambda s: (
            (_f(s, "r") / (_f(s, "r") + _f(s, "b"))) ** 2,
            _f(s, "r") / (_f(s, "r") + _f(s, "b")),
            (_f(s, "r") - 1) / (_f(s, "r") + _f(s, "b") - 1),
        ),
        0,
        _same("{}"),
        _stems("two_red_balls"),
        high=1,
    ),
    Calc(
        "at_least_one_six",
        lambda r: {"k": r.randint(2, 6)},
        lambda s: 1 - (5 / 6) ** _n(s, "k"),
        lambda s: (_n(s, "k") / 6, (5 / 6) ** _n(s, "k"), 1 - (1 / 6) ** _n(s, "k")),
        3,
        _same("{}"),
        _stems("at_least_one_six"),
        high=1,
    ),
    Calc(
        "coin_heads",
        _tosses,
        lambda s: Fraction(math.comb(int(_n(s, "k")), int(_n(s, "h"))), 2 ** int(_n(s, "k"))),
        lambda s: (
            Fraction(int(_n(s, "h")), int(_n(s, "k"))),
            Fraction(1, 2 ** int(_n(s, "k"))),
            Fraction(int(_n(s, "h")), 2 ** int(_n(s, "k"))),
        ),
        0,
        _same("{}"),
        _stems("coin_heads"),
        high=1,
    ),
    Calc(
        "linear_system",
        _system,
        lambda s: _n(s, "x"),
        lambda s: (_n(s, "y"), _n(s, "t") / (_n(s, "a") + _n(s, "b")), _n(s, "s") / 2),
        2,
        _same("{}"),
        _stems("linear_system"),
    ),
    Calc(
        "quadratic_root",
        _quadratic,
        lambda s: _n(s, "r1"),
        lambda s: (_n(s, "r2"), _n(s, "r1") + _n(s, "r2"), abs(_n(s, "r1") - _n(s, "r2"))),
        0,
        _same("{}"),
        _stems("quadratic_root"),
    ),
    Calc(
        "arithmetic_series",
        lambda r: {"a": r.randint(1, 20), "d": r.randint(2, 9), "k": r.randint(10, 40)},
        lambda s: _n(s, "k") * (2 * _n(s, "a") + (_n(s, "k") - 1) * _n(s, "d")) / 2,
        lambda s: (
            _n(s, "k") * (2 * _n(s, "a") + (_n(s, "k") - 1) * _n(s, "d")),
            _n(s, "k") * (2 * _n(s, "a") + _n(s, "k") * _n(s, "d")) / 2,
            _n(s, "a") + (_n(s, "k") - 1) * _n(s, "d"),
        ),
        0,
        _same("{}"),
        _stems("arithmetic_series"),
    ),
    Calc(
        "compound_interest",
        lambda r: {
            "p": 500 * r.randint(2, 40),
            "r": r.choice((2, 2.5, 3, 4, 5, 6)),
            "k": r.randint(2, 10),
        },
        lambda s: _n(s, "p") * (1 + _pct(s, "r")) ** _n(s, "k"),
        lambda s: (
            _n(s, "p") * (1 + _pct(s, "r") * _n(s, "k")),
            _n(s, "p") * (1 + _pct(s, "r")) ** (_n(s, "k") - 1),
            _n(s, "p") * (1 + _pct(s, "r")) ** (_n(s, "k") + 1),
        ),
        2,
        _MONEY,
        _stems("compound_interest"),
    ),
    Calc(
        "depreciation",
        lambda r: {
            "p": 1000 * r.randint(10, 50),
            "r": r.choice((10, 12, 15, 20, 25)),
            "k": r.randint(2, 5),
        },
        lambda s: _n(s, "p") * (1 - _pct(s, "r")) ** _n(s, "k"),
        lambda s: (
            _n(s, "p") * (1 - _pct(s, "r") * _n(s, "k")),
            _n(s, "p") * (1 - _pct(s, "r")) ** (_n(s, "k") - 1),
            _n(s, "p") * _pct(s, "r") * _n(s, "k"),
        ),
        2,
        _MONEY,
        _stems("depreciation"),
    ),
    Calc(
        "right_triangle_perimeter",
        _triangle,
        lambda s: _n(s, "a") + _n(s, "b") + _n(s, "c"),
        lambda s: (
            2 * (_n(s, "a") + _n(s, "b")),
            _n(s, "a") * _n(s, "b") / 2,
            _n(s, "a") + _n(s, "b") + _n(s, "c") - 1,
        ),
        0,
        _same("{} cm"),
        _stems("right_triangle_perimeter"),
    ),
    Calc(
        "cylinder_volume",
        lambda r: {"r": r.randint(2, 12), "h": r.randint(3, 30)},
        lambda s: 3.14 * _n(s, "r") ** 2 * _n(s, "h"),
        lambda s: (
            2 * 3.14 * _n(s, "r") * _n(s, "h"),
            3.14 * (2 * _n(s, "r")) ** 2 * _n(s, "h"),
            3.14 * _n(s, "r") ** 2 * _n(s, "h") / 3,
        ),
        2,
        _same("{} cm³"),
        _stems("cylinder_volume"),
    ),
    Calc(
        "sector_area",
        lambda r: {"r": r.randint(3, 20), "deg": r.choice((30, 45, 60, 72, 90, 120, 135, 150))},
        lambda s: _n(s, "deg") / 360 * 3.14 * _n(s, "r") ** 2,
        lambda s: (
            _n(s, "deg") / 360 * 2 * 3.14 * _n(s, "r"),
            3.14 * _n(s, "r") ** 2,
            _n(s, "deg") / 180 * 3.14 * _n(s, "r") ** 2,
        ),
        2,
        _same("{} cm²"),
        _stems("sector_area"),
    ),
    Calc(
        "half_life",
        _decay,
        lambda s: _n(s, "m") / 2 ** _n(s, "k"),
        lambda s: (
            _n(s, "m") / (2 * _n(s, "k")),
            _n(s, "m") / 2 ** (_n(s, "k") - 1),
            _n(s, "m") - _n(s, "m") / 2 ** _n(s, "k"),
        ),
        3,
        _same("{} g"),
        _stems("half_life"),
    ),
    Calc(
        "price_change",
        lambda r: {
            "p": 10 * r.randint(10, 200),
            "u": r.choice((10, 15, 20, 25, 30)),
            "d": r.choice((10, 15, 20, 25, 30)),
        },
        lambda s: _n(s, "p") * (1 + _pct(s, "u")) * (1 - _pct(s, "d")),
        lambda s: (
            _n(s, "p") * (1 + _pct(s, "u") - _pct(s, "d")),
            _n(s, "p") * (1 - _pct(s, "d")),
            _n(s, "p") * (1 + _pct(s, "u")) * _pct(s, "d"),
        ),
        2,
        _MONEY,
        _stems("price_change"),
    ),
)
