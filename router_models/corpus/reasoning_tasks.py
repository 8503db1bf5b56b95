"""Complex prompts: generated multi-step reasoning tasks (dates, logic, tracking, counting).

Each task needs several dependent steps even though the prompt can be short and contains no
maths vocabulary; they teach the router that "short and plain" is not the same as "easy".
"""

from __future__ import annotations

import datetime as dt
import itertools
from random import Random

from router_models.corpus.lexicon import MONTHS, NAMES, one, some

# fmt: off
_ITEMS = {
    "fruits": ("apple", "banana", "plum", "peach", "orange", "grape", "nectarine"),
    "vegetables": ("carrot", "onion", "cabbage", "potato", "lettuce head", "yam"),
    "musical instruments": ("violin", "trumpet", "flute", "piano", "drum", "clarinet"),
    "animals": ("cat", "rabbit", "goat", "snail", "duck", "pig"),
}
_COUNTS = ("a", "two", "three", "four", "an")
_COLORS = ("red", "green", "blue", "yellow", "white", "black", "purple")
_MOVES = ("Walk {n} paces ahead.", "Walk {n} paces back.", "Face left.", "Face right.",
          "Spin half a turn.", "Sidestep {n} paces to the left.",
          "Sidestep {n} paces to the right.")
_ASK_TAILS = ("", " Think step by step.", " Explain.", " Answer with yes or no and show why.")
# fmt: on


def date_arithmetic(rng: Random) -> str:
    """Date reasoning with an explicit output format."""
    start = dt.date(rng.randint(1990, 2030), rng.randint(1, 12), rng.randint(1, 28))
    n = rng.randint(2, 400)
    shown = one(
        rng,
        (
            start.strftime("%m/%d/%Y"),
            f"{MONTHS[start.month - 1]} {start.day}, {start.year}",
            start.isoformat(),
        ),
    )
    return one(
        rng,
        (
            f"Today is {shown}. What was the date {n} days ago in MM/DD/YYYY?",
            f"Yesterday was {shown}. What is the date {n} days from today?",
            f"A project started on {shown} and takes {n} working days (no weekends). "
            "When does it end?",
            f"If {shown} is a {start.strftime('%A')}, what day of the week is {n} days later, and "
            "what is the date?",
            f"My passport expires {n} days after {shown}. Which month and year is that?",
        ),
    )


def boolean_expression(rng: Random) -> str:
    """Evaluate a nested boolean expression."""

    def term(depth: int) -> str:
        if depth == 0:
            return one(rng, ("True", "False"))
        left, right = term(depth - 1), term(depth - 1)
        op = one(rng, ("and", "or"))
        expr = f"( {left} {op} {right} )" if rng.random() < 0.6 else f"{left} {op} {right}"
        return f"not {expr}" if rng.random() < 0.3 else expr

    expression = term(rng.randint(1, 3))
    return one(
        rng,
        (
            f"{expression} is",
            f"Evaluate: {expression}",
            f"What does this evaluate to? {expression}",
        ),
    )


def navigation(rng: Random) -> str:
    """Follow movement instructions and decide where you end up."""
    steps = [one(rng, _MOVES).format(n=rng.randint(1, 9)) for _ in range(rng.randint(4, 8))]
    lead = one(
        rng,
        (
            "Follow these moves. Are you back where you began?",
            "Keep facing the same way. Where do you end up relative to the start?",
        ),
    )
    return f"{lead} {' '.join(steps)}{one(rng, _ASK_TAILS)}"


def swaps(rng: Random) -> str:
    """Track objects through a sequence of swaps."""
    people = some(rng, NAMES, rng.randint(3, 5))
    colors = some(rng, _COLORS, len(people))
    owned = ", ".join(f"{p} has a {c} ball" for p, c in zip(people, colors, strict=True))
    pairs = (some(rng, people, 2) for _ in range(rng.randint(3, 5)))
    trades = [f"{x} and {y} swap balls" for x, y in pairs]
    sequence = ". Then ".join(trades)
    return (
        f"At the start of a game, {owned}. First, {sequence}. At the end, which ball does "
        f"{one(rng, people)} have?"
    )


def web_of_lies(rng: Random) -> str:
    """A chain of statements about who tells the truth."""
    people = some(rng, NAMES, rng.randint(4, 5))
    parts = [f"{people[0]} {one(rng, ('tells the truth', 'lies'))}."]
    for prev, cur in itertools.pairwise(people):
        parts.append(f"{cur} says {prev} {one(rng, ('lies', 'tells the truth'))}.")
    return f"Question: {' '.join(parts)} Does {people[-1]} tell the truth?"


def object_counting(rng: Random) -> str:
    """Count the items of one kind in a mixed list."""
    target = one(rng, tuple(_ITEMS))
    pool = [(k, v) for k, items in _ITEMS.items() for v in items]
    chosen = some(rng, pool, rng.randint(5, 8))
    listing = ", ".join(f"{one(rng, _COUNTS)} {name}" for _, name in chosen)
    return f"I have {listing}. How many {target} do I have?"


def ordering(rng: Random) -> str:
    """Deduce an order from pairwise clues."""
    things = some(rng, _COLORS, rng.randint(4, 5))
    order = list(things)
    clues = [
        f"The {a} book sits somewhere left of the {b} one." for a, b in itertools.pairwise(order)
    ]
    rng.shuffle(clues)
    where = one(rng, ("second from the left", "in the middle", "second from the right"))
    return (
        f"On a shelf there are {len(things)} books: {', '.join(things)}. "
        f"{' '.join(clues)} Which book is {where}?"
    )
