"""Complex prompts: write, complete, fix or explain non-trivial code."""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import PROG_LANGS, one, phrases

# fmt: off
_STUB_DOCS = (
    '    """{D}.\n    >>> {f}({x})\n    {y}\n    """',
    '    """ Given {args}, {d}.\n    Examples:\n    {f}({x}) == {y}\n    """',
    '    """\n    {D}.\n    For example, {f}({x}) should return {y}.\n    """',
    '    """{D}.\n\n    Args:\n        {args}: the input.\n\n'
    '    Returns the result, e.g. {y} for {x}.\n    """',
    "    # {D}\n    # {f}({x}) -> {y}",
)
_STUB_CLOSERS = ("", "", "\n", "\n    pass", "\n    # your code here", "\n\nComplete the function.",
                 "\n\nfinish this function", "\n    raise NotImplementedError")
_RETURN_TYPES = ("int", "bool", "list", "str", "float", "List[int]", "Optional[int]")
_STATEMENT_HEADS = ("Problem", "Task", "Challenge", "", "Description:", "Exercise")
_STATEMENT_TAILS = ("Aim for better than O(n^2).", "Use O(1) extra space if you can.", "",
                    "Explain your approach before the code.", "Return -1 if there is no answer.")
# fmt: on


def _task(rng: Random) -> tuple[str, str, str, str, str]:
    d, f, args, x, y = (part.strip() for part in one(rng, phrases("code_tasks")).split(" | "))
    return d, f, args, x, y


def write_function(rng: Random) -> str:
    """Write a function for a described task."""
    d, f, _, x, y = _task(rng)
    if rng.random() < 0.35:
        d = one(rng, phrases("code_descriptions"))
    ask = one(rng, phrases("code_write_asks"))
    return ask.format(d=d, f=f, x=x, y=y, lang=one(rng, PROG_LANGS))


def write_component(rng: Random) -> str:
    """Implement a class, algorithm, script, query or config."""
    return one(rng, phrases("code_components")).format(
        lang=one(rng, PROG_LANGS), year=rng.randint(2015, 2025)
    )


def stub(rng: Random) -> str:
    """A function signature with a docstring to complete, like an editor would send."""
    d, f, args, x, y = _task(rng)
    doc = one(rng, _STUB_DOCS).format(D=d[0].upper() + d[1:], d=d, f=f, x=x, y=y, args=args)
    if rng.random() < 0.15:
        return f"// {d}\nfunction {f}({args}) {{\n  // TODO\n}}"
    header = f"def {f}({args}):"
    if rng.random() < 0.3:
        header = f"from typing import List, Optional\n\n\ndef {f}({args}) -> "
        header += one(rng, _RETURN_TYPES) + ":"
    return header + "\n" + doc + one(rng, _STUB_CLOSERS)


def _snippet(rng: Random) -> tuple[str, str]:
    code, _, err = one(rng, phrases("code_buggy")).partition(" || ")
    return code, err


def debug(rng: Random) -> str:
    """Find and fix a bug in a snippet."""
    code, err = _snippet(rng)
    return one(rng, phrases("code_bug_asks")).format(code=code, err=err)


def snippet_question(rng: Random) -> str:
    """What is wrong with / what does this short snippet print."""
    code = one(rng, phrases("code_snippets"))
    return one(rng, phrases("code_snippet_asks")).format(code=code)


def explain_or_refactor(rng: Random) -> str:
    """Explain, refactor, port, test or optimise a snippet."""
    code, _ = _snippet(rng)
    return one(rng, phrases("code_explain")).format(code=code, lang=one(rng, PROG_LANGS))


def problem_statement(rng: Random) -> str:
    """A contest-style problem statement with examples and constraints."""
    d, _, args, x, y = _task(rng)
    n = rng.choice((10**3, 10**5, 2 * 10**5, 10**6))
    return (
        f"{one(rng, _STATEMENT_HEADS)}\nGiven {args.replace(', ', ' and ')}, {d}.\n\n"
        f"Example 1:\nInput: {x}\nOutput: {y}\n\n"
        f"Constraints:\n1 <= length <= {n}\n{one(rng, _STATEMENT_TAILS)}"
    ).strip()
