"""Run the shell blocks of a Markdown document that are marked to be run.

The convention: a fenced ``bash`` or ``sh`` block preceded (on the line before its fence) by

    <!-- test: run -->

is meant to be run exactly as printed. All marked blocks of one document run in order in one
``bash -euo pipefail`` session (so a block may use what an earlier one exported), in a scratch
directory that links the repository's ``.venv``, ``config``, ``deploy``, ``docs`` and
``scripts``; the only rewriting is of loopback ports (``127.0.0.1:8080``, ``localhost:8080``
and a YAML ``port: 8080``) to the free ports of the stack the test started. Unmarked blocks
(``make demo``, deployment commands, placeholders such as ``KEY_ID``) are documentation only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "<!-- test: run -->"
LINKED = (".venv", "config", "deploy", "docs", "scripts")
_FENCE = re.compile(r"^```(bash|sh)\s*$")


@dataclass(frozen=True)
class Block:
    """One marked block: where it starts in its document, and its text."""

    line: int
    text: str


def marked_blocks(path: Path) -> list[Block]:
    """The blocks of ``path`` marked ``<!-- test: run -->``; a mark without a shell fence fails."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    for index, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        fence = lines[index + 1] if index + 1 < len(lines) else ""
        if not _FENCE.match(fence):
            raise ValueError(f"{path}:{index + 1}: {MARK} must be followed by a bash/sh fence")
        end = lines.index("```", index + 2)
        blocks.append(Block(index + 2, "\n".join(lines[index + 2 : end])))
    return blocks


def scratch_dir(root: Path, extra_links: Mapping[str, Path] | None = None) -> Path:
    """A working directory where the documents' relative paths resolve to the repository."""
    root.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    for name, target in (extra_links or {}).items():
        (root / name).symlink_to(target)
    return root


def run_blocks(
    blocks: list[Block],
    *,
    cwd: Path,
    ports: Mapping[int, int],
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``blocks`` in one bash session with ``127.0.0.1:OLD`` rewritten to ``NEW``."""
    script = ["set -euo pipefail"]
    for block in blocks:
        text = block.text
        for old, new in ports.items():
            text = re.sub(rf"(127\.0\.0\.1|localhost):{old}\b", rf"\g<1>:{new}", text)
            text = re.sub(rf"\bport: {old}\b", f"port: {new}", text)
        script += [f"echo '::: block at line {block.line}' >&2", text]
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIERGATE_")}
    proc = subprocess.Popen(
        ["bash", "-c", "\n".join(script)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, **(env or {})},
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        # Whatever a block left running in the background (a server it started) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
