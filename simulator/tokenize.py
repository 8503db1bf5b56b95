"""A cheap, deterministic tokenizer and chat template.

Tokens are words (``\\w+``) or single punctuation characters; whitespace is not a token.
This is nowhere near a real BPE tokenizer, but it is stable, fast, and makes the prefix
cache see the same token sequence for the same rendered text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_json = msgspec.json.Encoder()


def tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """How many tokens ``text`` has."""
    return len(_TOKEN_RE.findall(text))


def split_pieces(text: str, limit: int | None) -> tuple[list[str], list[str]]:
    """Split ``text`` into at most ``limit`` streamable pieces and their tokens.

    Each piece carries one token and the whitespace before it, so that joining the pieces
    gives back the text (cut after the ``limit``-th token).
    """
    pieces: list[str] = []
    tokens: list[str] = []
    start = 0
    for match in _TOKEN_RE.finditer(text):
        if limit is not None and len(tokens) >= limit:
            break
        pieces.append(text[start : match.end()])
        tokens.append(match.group())
        start = match.end()
    return pieces, tokens


def content_text(content: str | list[Any] | None) -> str:
    """Flatten OpenAI message content (string or list of parts) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part, dict):
            parts.append(f"<{part.get('type', 'part')}>")
        else:
            parts.append(str(part))
    return "\n".join(parts)


def render_chat(messages: Sequence[tuple[str, str | list[Any] | None, Any]], tools: Any) -> str:
    """Render a conversation with a fixed template; ``messages`` are (role, content, tool_calls).

    The whole conversation (tools first, then every message, then the generation prompt) is
    rendered so the prefix cache sees what a real chat template would feed the engine.
    """
    lines: list[str] = []
    if tools:
        lines.append("<|tools|>")
        lines.append(_json.encode(tools).decode())
    for role, content, tool_calls in messages:
        lines.append(f"<|{role}|>")
        lines.append(content_text(content))
        if tool_calls:
            lines.append(_json.encode(tool_calls).decode())
    lines.append("<|assistant|>")
    return "\n".join(lines) + "\n"
