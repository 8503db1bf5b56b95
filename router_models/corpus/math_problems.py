"""Complex prompts: multi-step arithmetic word problems and symbolic maths."""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import CITIES, FOODS, MONTHS, NAMES, one, phrases, some

# fmt: off
_QUESTION_ENDINGS = (
    "", "", "", "", " Show your work.", " Explain step by step.",
    " Give the final answer at the end.",
    " Please explain how you got the answer.", " Think it through carefully.", " Answer: ",
)
_MATH_LEADS = ("", "", "", "", "Math question: ", "Help with homework - ", "Can you solve this? ",
               "I'm stuck on this problem. ", "Problem: ", "Quick one: ", "Question: ")
_ACTIVITIES = ("football", "tennis", "basketball", "the piano", "volleyball", "chess club")
# fmt: on


def _numbers(rng: Random) -> dict[str, object]:
    """Every slot the word-problem templates use, with plausible values."""
    heads = rng.randint(20, 60)
    cows = rng.randint(3, heads - 3)
    a, b, c = some(rng, NAMES, 3)
    return {
        "n1": rng.randint(12, 60),
        "n2": rng.randint(3, 30),
        "k": rng.randint(2, 9),
        "h": rng.randint(2, 9),
        "m": rng.randint(2, 12),
        "d": rng.randint(60, 480),
        "s1": rng.randint(40, 120),
        "s2": rng.randint(15, 90),
        "w": rng.randint(12, 45),
        "w2": rng.randint(1, 6),
        "p": rng.randint(5, 40),
        "q": rng.randint(5, 30),
        "u": rng.randint(2, 60),
        "bulk": rng.randint(10, 99),
        "big": rng.randint(120, 2000),
        "bill": one(rng, (20, 50, 100)),
        "month_count": rng.randint(2, 6),
        "heads": heads,
        "legs": 2 * heads + 2 * cows,
        "a": a,
        "b": b,
        "c": c,
        "c1": one(rng, CITIES),
        "c2": one(rng, CITIES),
        "food": one(rng, FOODS),
        "s": one(rng, _ACTIVITIES),
        "month": one(rng, MONTHS),
    }


def word_problem(rng: Random) -> str:
    """A multi-step arithmetic story problem with fresh names and numbers."""
    text = one(rng, phrases("math_word")).format(**_numbers(rng))
    return one(rng, _MATH_LEADS) + text + one(rng, _QUESTION_ENDINGS)


def symbolic(rng: Random) -> str:
    """Algebra, calculus, number theory, probability or proof."""
    small = {k: rng.randint(2, 9) for k in ("a", "b", "c", "d", "e", "m", "n")}
    s = rng.randint(3, 12)
    values = {
        **small,
        "s": s,
        "p": rng.randint(2, s * s // 4),
        "big": rng.randint(20, 1000),
        "big2": rng.randint(10, 500),
        "a2": small["a"] + rng.randint(2, 9),
    }
    return one(rng, _MATH_LEADS) + one(rng, phrases("math_symbolic")).format(**values)


def short_math(rng: Random) -> str:
    """A short but multi-step calculation."""
    values = {k: rng.randint(2, 19) for k in ("a", "b", "c", "d")}
    values.update(big=rng.randint(100, 9999), m=rng.randint(3, 13), sq=rng.randint(4, 40) ** 2)
    return one(rng, phrases("math_short")).format(**values)
