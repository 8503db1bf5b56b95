"""Every documented command that writes a secret file creates it unreadable by others.

Run literally under the usual ``umask 022``, ``python3 -c "…token_urlsafe…" > admin-token``
creates a 0644 file: the Helm README never tightened it afterwards, and the compose and
existing-vLLM recipes left it readable by every local user until a later ``chmod``. Each such
line, executed as printed, must leave the file with no group or other permission.
"""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "docs" / "deployment.md",
    REPO / "docs" / "existing-vllm.md",
    REPO / "helm" / "tiergate" / "README.md",
]


def _secret_lines() -> list[tuple[str, str, str]]:
    """(doc, command line, file it writes) for every shell line that generates a secret."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, flags=re.DOTALL):
            for line in str(block).splitlines():
                if "token_urlsafe" in line:
                    target = re.search(r">\s*([\w./-]+)\)?\s*$", line)
                    assert target is not None, line
                    found.append((doc.name, line.strip(), target[1]))
    return found


SECRET_LINES = _secret_lines()


def test_the_docs_generate_secrets_somewhere() -> None:
    """The admin token (and Grafana's password) are generated in all three docs."""
    assert {doc for doc, _, _ in SECRET_LINES} == {p.name for p in DOCS}


@pytest.mark.parametrize(("doc", "line", "target"), SECRET_LINES)
def test_a_generated_secret_is_never_readable_by_others(
    tmp_path: Path, doc: str, line: str, target: str
) -> None:
    """The command, run as printed under umask 022, leaves its file private to its owner."""
    (tmp_path / "deploy" / "secrets").mkdir(parents=True)
    subprocess.run(  # a documented command line, run in a scratch directory
        ["bash", "-c", f"umask 022\n{line}"], cwd=tmp_path, check=True, timeout=60
    )
    written = tmp_path / target
    assert written.read_text(encoding="utf-8").strip()
    mode = stat.S_IMODE(written.stat().st_mode)
    assert mode & 0o077 == 0, f"{doc}: {line!r} leaves {target} at {oct(mode)}"
