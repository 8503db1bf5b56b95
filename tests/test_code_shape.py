"""The code's shape (issue 33): no module over 600 lines, no function over 60, in the packages.

A function's length is ``end_lineno - lineno + 1`` of its ``def`` (docstring, nested functions
and methods included; decorators not); every ``def`` counts, nested ones and methods too.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "router_models", "policies", "simulator", "loadgen")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def _long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function in ``source`` longer than the limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append((node.name, node.lineno, length))
    return found


def test_no_module_is_over_600_lines() -> None:
    """Every module of the five packages has at most 600 lines."""
    modules = _modules()
    assert len(modules) > 50  # the packages were found
    lines = {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for path in modules
    }
    assert {name: n for name, n in lines.items() if n > MAX_MODULE_LINES} == {}


def test_no_function_is_over_60_lines() -> None:
    """Every function and method of the five packages spans at most 60 lines."""
    over = {
        f"{path.relative_to(REPO)}:{line} {name}": length
        for path in _modules()
        for name, line, length in _long_functions(path.read_text(encoding="utf-8"))
    }
    assert over == {}


def test_the_function_measure_counts_docstring_and_nested_defs() -> None:
    """A 61-line def (docstring included) is caught, a 60-line one is not, nested ones too."""
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    at_limit = f'def fits():\n    """Doc."""\n{body}'
    over = f'def too_long():\n    """Doc."""\n{body}    return x0\n'
    nested = "class Host:\n" + "".join(f"    {line}\n" for line in over.splitlines())
    assert _long_functions(at_limit) == []
    assert _long_functions(over) == [("too_long", 1, 61)]
    assert _long_functions(nested) == [("too_long", 2, 61)]
