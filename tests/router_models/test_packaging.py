"""router_models/packaging.py: crafted packaging is not scored; requests about it keep it."""

from __future__ import annotations

import random
import re
import time

import router_models
from router_models.packaging import _drop_latex, unwrap, unwrap_text

LATEX = "$$\\int_0^1 \\frac{x^2}{\\sqrt{1+x^2}}\\,dx$$\n\n"
FENCE = "```python\ndef f(xs):\n    return [x * x for x in xs]\nprint(f([1]))\n```\n"


def test_packaging_around_a_trivial_request_is_removed() -> None:
    """LaTeX, a fence, chain-of-thought phrasing, padding and numbers leave the words."""
    assert unwrap_text(LATEX + "hi") == "hi"
    assert unwrap_text(FENCE + "hello there") == "hello there"
    assert unwrap_text("Prove rigorously, step by step: Who wrote Hamlet?") == "Who wrote Hamlet?"
    assert unwrap_text("thanks" + "." * 300 + "\n" * 40) == "thanks."
    numbers = " ".join(str(i * 37 % 91) for i in range(40))
    assert unwrap_text(numbers + "\nWhat colour is the sky?") == "What colour is the sky?"


def test_requests_about_their_block_are_scored_as_sent() -> None:
    """A request that refers to its block keeps it (the same string object)."""
    for text in (
        "What is wrong with this code?\n" + FENCE,
        "Solve " + LATEX,
        "Sort these numbers: 5 3 9 1 7 2 8 6 4",
        "Prove that the square root of 2 is irrational.",
        "Write a Python function that merges two sorted lists.",
    ):
        assert unwrap_text(text) is text


def test_unwrapped_bodies_score_low_and_plain_bodies_are_untouched() -> None:
    """Under the shipped artifact the wrapped "hi" scores like "hi"; an ordinary body comes
    back as the same object; unusable tools and json_object are not scored."""
    router = router_models.load()
    threshold = router.threshold_for_share(0.3)
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    assert unwrap(plain) is plain
    wrapped = {"messages": [{"role": "user", "content": LATEX + "hi"}]}
    assert router.score(wrapped) >= threshold
    assert router.score(unwrap(wrapped)) == router.score(plain)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    dressed = {**plain, "tools": tools, "tool_choice": "none"}
    dressed["response_format"] = {"type": "json_object"}
    assert unwrap(dressed) == plain


# The regex ``_drop_latex`` replaced (quadratic on openers without closers): the reference.
_LATEX_REGEX = re.compile(
    r"\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|\\begin\{([a-z*]+)\}.+?\\end\{\1\}"
    r"|\$[^$\n]*\\[a-zA-Z]+[^$\n]*\$",
    re.DOTALL,
)
_PIECES = ("$", "$$", "\\[", "\\]", "\\(", "\\)", "\\begin{a}", "\\end{a}", "\\begin{bb}",
           "\\end{bb}", "\\begin{", "\\frac", "\\", "x", " ", "\n", "}", "{", "a")  # fmt: skip


def test_latex_blocks_are_removed_exactly_as_the_regex_did() -> None:
    """``_drop_latex`` leaves what ``re.sub`` with the old block regex left, on 20,000 random
    texts built from LaTeX openers, closers and filler, and on ordinary maths prompts."""
    rng = random.Random(7)
    texts = [
        "Solve $$x^2 = 4$$ and $\\frac{1}{2}$ please",
        "\\begin{align} a &= b \\end{align} then \\[ y \\] and \\( z \\)",
        "It costs $5 and $6, not \\$x",
        "$\\alpha\n$ and $$$$ and \\begin{a*}x\\end{a*}",
    ]
    texts += ["".join(rng.choices(_PIECES, k=rng.randint(0, 30))) for _ in range(20_000)]
    for text in texts:
        assert _drop_latex(text) == _LATEX_REGEX.sub(" ", text), repr(text)


def test_openers_without_closers_cost_linear_time() -> None:
    """23,000 characters of LaTeX openers with no closers unwrap in well under a second each
    (the old regex: 1 to 3 s; the request path runs this on the event loop)."""
    hostile = [
        "\\[" * 11_500,
        "\\(" * 11_500,
        "$" + "\\a" * 11_500,
        "\\begin{a}" * 2_555,
        ("\\begin{abc}" + "x" * 10) * 1_095,
        "$$x" * 7_666,
    ]
    for text in hostile:
        started = time.perf_counter()
        unwrap_text(text)
        took = time.perf_counter() - started
        assert took < 0.2, f"{text[:12]!r}...: {took:.3f}s"
