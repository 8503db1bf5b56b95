"""The request path's structure: one writer of the request context, no telemetry in forwarding.

Import-linter keeps forwarding and the relay from importing the context or telemetry; these
checks read the source for what imports cannot show (a context reached through an argument).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
# The pipeline writes the context; the context's own methods keep what they compute.
WRITERS = {"http/proxy.py", "pipeline/context.py"}
_TELEMETRY_NAMES = {"trace", "tracing", "tracer", "span", "spans", "metrics", "observer"}


def _is_context(node: ast.expr) -> bool:
    """``ctx`` or ``self.ctx`` (how every stage names the request context)."""
    if isinstance(node, ast.Name):
        return node.id == "ctx"
    return isinstance(node, ast.Attribute) and node.attr == "ctx" and _is_context_owner(node)


def _is_context_owner(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def _context_writes(tree: ast.AST) -> Iterator[int]:
    """Lines that assign a field of the context or change its extra headers."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for written in targets:
            # ctx.extra_headers[...] = ... writes the headers' dict of the context
            target = written.value if isinstance(written, ast.Subscript) else written
            if isinstance(target, ast.Attribute) and (
                _is_context(target.value)
                or (isinstance(target.value, ast.Attribute) and _is_context(target.value.value))
            ):
                yield target.lineno
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"update", "setdefault", "pop", "clear"}
            and isinstance(node.func.value, ast.Attribute)
            and _is_context(node.func.value.value)
        ):
            yield node.func.lineno


def _modules() -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted(GATEWAY.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_only_the_pipeline_writes_the_request_context() -> None:
    """No module but proxy.py (and the context itself) assigns a RequestContext field."""
    writes = {
        f"{path.relative_to(GATEWAY)}:{line}"
        for path, tree in _modules()
        for line in _context_writes(tree)
    }
    outside = sorted(w for w in writes if w.split(":")[0] not in WRITERS)
    assert outside == []
    assert any(w.startswith("http/proxy.py:") for w in writes)  # the check does see writes


def _names(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return found


def test_forwarding_and_the_relay_hold_no_telemetry() -> None:
    """Neither names a trace, span, metrics or observer: telemetry listens from outside."""
    for name in (
        "upstream/forwarding.py",
        "upstream/relay.py",
        "upstream/stream_tally.py",
        "upstream/stream_cuts.py",
        "upstream/attempt.py",
        "upstream/retry.py",
    ):
        tree = ast.parse((GATEWAY / name).read_text(encoding="utf-8"))
        assert _names(tree) & _TELEMETRY_NAMES == set(), name
    proxy = ast.parse((GATEWAY / "http/proxy.py").read_text(encoding="utf-8"))
    assert "trace" in _names(proxy)  # the pipeline hands events to the trace
