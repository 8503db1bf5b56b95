"""The head every benchmark report starts with: its title and the command that made it."""

from __future__ import annotations


def report_head(title: str, command: str) -> list[str]:
    """Markdown lines: ``# title``, then the command in a code block, then a blank line."""
    return [f"# {title}", "", "Command:", "", "```", command, "```", ""]
