"""The shipped packages import no other library's private modules (issue 33: one HTTP edge, on
public APIs only): no ``_``-prefixed module of a third-party package, nothing of uvicorn's
``protocols`` package (uvicorn runs the process, through ``uvicorn.Config``/``uvicorn.Server``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN = {"gateway", "router_models", "policies", "simulator", "loadgen", "tiergate"}
SHIPPED = ("gateway", "router_models", "policies", "simulator", "loadgen")


def _imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _private(module: str) -> bool:
    parts = module.split(".")
    if parts[0] in OWN or parts[0] == "__future__":
        return False
    return any(part.startswith("_") for part in parts) or module.startswith("uvicorn.protocols")


def test_no_shipped_module_imports_a_private_module_of_another_library() -> None:
    """Every ``import``/``from`` in the shipped packages names public modules only."""
    found = [
        f"{path.relative_to(ROOT)}: {module}"
        for package in SHIPPED
        for path in sorted((ROOT / package).rglob("*.py"))
        for module in _imported(ast.parse(path.read_text(encoding="utf-8")))
        if _private(module)
    ]
    assert found == []


def test_the_check_sees_what_it_looks_for() -> None:
    """The scan finds the imports the old protocol had, and passes the project's own."""
    old = "from uvicorn._types import Scope\nimport uvicorn.protocols.http.flow_control\n"
    assert [m for m in _imported(ast.parse(old)) if _private(m)] == [
        "uvicorn._types",
        "uvicorn.protocols.http.flow_control",
    ]
    assert not _private("gateway.access._private_helper")
    assert not _private("prometheus_client.core")
