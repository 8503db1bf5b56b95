"""Complex prompts: reasoning puzzles, estimates, trade-offs and long analytical writing."""

from __future__ import annotations

from random import Random

from router_models.corpus import passages
from router_models.corpus.lexicon import (
    BUSINESSES,
    CITIES,
    HOBBIES,
    JOBS,
    NAMES,
    PRODUCTS,
    TOPICS,
    WEEKDAYS,
    one,
    phrases,
    some,
)

# fmt: off
_FERMI_THINGS = ("golf balls", "traffic lights", "hairdressers", "dogs", "pizzas", "trees",
                 "toothbrushes", "pairs of shoes", "litres of water", "coffee cups")
_GROUPS = ("small businesses", "teenagers", "rural communities", "retirees", "cities",
           "developing countries", "the job market", "mental health", "democracy", "families")
_ORDINALS = ("second", "third", "last", "fifth")
_PUZZLE_TAILS = ("", "", "", " Explain your reasoning.", " Think step by step.",
                 " Justify the answer.", " Show how you worked it out.", " Let's think about it.")
# fmt: on


def _values(rng: Random) -> dict[str, object]:
    a, b, c, d, e = some(rng, NAMES, 5)
    t1, t2 = some(rng, TOPICS, 2)
    job, job2 = some(rng, JOBS, 2)
    return {
        "a": a,
        "b": b,
        "c": c,
        "d": d,
        "e": e,
        "n": rng.randint(3, 9),
        "m": rng.randint(10, 120),
        "day": one(rng, WEEKDAYS),
        "big": rng.randint(20, 400),
        "h": rng.randint(1, 12),
        "mm": one(rng, ("15", "20", "40", "45", "50")),
        "job": job,
        "job2": job2,
        "ordinal": one(rng, _ORDINALS),
        "thing": one(rng, _FERMI_THINGS),
        "city": one(rng, CITIES),
        "product": one(rng, PRODUCTS),
        "biz": one(rng, BUSINESSES),
        "hobby": one(rng, HOBBIES),
        "big2": rng.randint(22, 45) * 1000,
        "topic": t1,
        "topic2": t2,
        "group": one(rng, _GROUPS),
    }


def puzzle(rng: Random) -> str:
    """A logic, lateral-thinking or counting puzzle."""
    return one(rng, phrases("puzzles")).format(**_values(rng)) + one(rng, _PUZZLE_TAILS)


def fermi(rng: Random) -> str:
    """An estimation question that needs explicit assumptions."""
    return one(rng, phrases("fermi")).format(**_values(rng))


def causal(rng: Random) -> str:
    """Diagnosis, trade-off or planning under constraints."""
    values = _values(rng)
    values["big"] = rng.randint(18, 40) * 1000
    return one(rng, phrases("causal")).format(**values)


def essay(rng: Random) -> str:
    """Long analytical writing, sometimes about a given passage."""
    if rng.random() < 0.15:
        text = passages.news(rng)
        if rng.random() < 0.4:
            text = passages.long_document(rng, text)
        return one(rng, phrases("passage_analysis")).format(p=text)
    return one(rng, phrases("essays")).format(**_values(rng))
