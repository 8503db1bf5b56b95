"""Packaging that cannot buy the precise tier: score the user's own words (issue 34).

A short simple request wrapped in a LaTeX block, a code fence, chain-of-thought phrasing
("Prove rigorously, step by step"), padding or a string of numbers scored like a hard one: the
router's features count LaTeX, fences, lines, numbers and the words "prove" and "step", and the
wrapping carries them all. ``unwrap(body)`` returns the body the router should score instead:

* chain-of-thought boilerplate is removed (``step by step``, ``think carefully``, ``show your
  work``, "prove rigorously," used as a clause of its own...): it asks for a style of answer,
  not a harder task;
* a LaTeX block (``$$...$$``, ``\\[...\\]``, ``\\(...\\)``, ``\\begin{...}...\\end{...}``,
  inline ``$...$`` with a command in it), a fenced code block, a run of 8 or more numbers or
  one of 12 or more digits is removed **when the rest of the message does not
  refer to it**: none of the words that ask about code, maths or numbers (``code``, ``fix``,
  ``solve``, ``integral``, ``sum``, ``above``...) occurs outside it ("it", "this" and "here"
  alone do not count: "What time is it?" says them about nothing in the block). A request that
  asks about its block keeps it, so "What is wrong with this code?" and "Solve $$...$$" score
  as before;
* padding is squeezed: long runs of one symbol or whitespace character, repeated lines.

When nothing is removed the body is returned as it is (the same object), so ordinary traffic
scores exactly as before and the artifact's features are unchanged. A request whose whole
message is packaging (nothing left) is scored as sent. ``tools`` with ``tool_choice: "none"``
are dropped from the scored body: the model may not call them, so they make nothing harder.
``response_format: json_object`` is dropped too: whether it needs the precise tier is a policy
(``router.json_object_to_precise``), not something a trivial prompt can buy by asking for it.

Only the message the router scores is unwrapped (the last user message, else the last one;
its text parts joined as the router joins them; a completions prompt list likewise). Pure
functions of the body; the gateway applies them before scoring (``router.unwrap_packaging``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

_COT: Final = re.compile(
    r"\b(?:let'?s |please )?(?:think|reason|work|go|walk me)(?: it| this)?(?: through)?"
    r" (?:step[- ]by[- ]step|carefully|rigorously|thoroughly|logically)\b[,.:;!]?"
    r"|\b(?:step[- ]by[- ]step|rigorously|thoroughly|in (?:full|great) detail)\b[,.:;!]?"
    r"|\bshow (?:all )?(?:your|the) (?:work|reasoning|steps)\b[,.:;!]?"
    r"|\bprove (?:it |this )?(?:rigorously|formally|carefully)?\s*[,.:;]"
    r"|\b(?:chain of thought|be (?:rigorous|precise|thorough))\b[,.:;!]?",
    re.IGNORECASE,
)
# A LaTeX block: $$...$$, \[...\], \(...\), \begin{name}...\end{name}, or inline $...$ with a
# command in it. ``_drop_latex`` finds them from these openers rather than with one regex of
# lazy ``.+?`` bodies: such a regex scans to the end of the text from every opener that has
# no closer, so 11,000 \[ took seconds (tests/adversarial/test_attack_routing.py).
_LATEX_OPENER: Final = re.compile(r"\$|\\(?:\[|\(|begin\{([a-z*]+)\})")
_LATEX_COMMAND: Final = re.compile(r"\\[a-zA-Z]")
_BRACKET_CLOSERS: Final = {"[": "\\]", "(": "\\)"}
# Longer texts are scored as sent: the passes below cost about 2.7 s a megabyte of plain
# words, on the event loop. Above the reach of the default long-prompt rule (6,000 tokens,
# 24,000 ASCII characters), so only a deployment or key without that rule scores such text.
UNWRAP_MAX_CHARS: Final = 32_768
_FENCE: Final = re.compile(r"```[^\n`]*\n.*?(?:```|\Z)|~~~[^\n]*\n.*?(?:~~~|\Z)", re.DOTALL)
_NUMBER_RUN: Final = re.compile(
    r"(?:[-+]?\d+(?:[.,]\d+)?[\s,;]+){7,}[-+]?\d+(?:[.,]\d+)?|\d[\d.,]{11,}"
)
_REPEATED_WORD: Final = re.compile(r"\b(\w+)(?:\W+\1\b){3,}", re.IGNORECASE)
_REPEATED_CHAR: Final = re.compile(r"([^\w\s])\1{7,}|(\s)\2{15,}")
_LEFTOVER: Final = re.compile(
    r"(?:^|(?<=[.!?:;]))[\s,.;:!-]*(?:(?:and|then|also|so|now|please)\b[\s,.;:!-]*)+",
    re.IGNORECASE,
)
_REFERS: Final = re.compile(
    r"\b(?:code|program|script|function|snippet|bug|error|fix|debug|refactor|optimi[sz]e|"
    r"compile|output|run|runs|implement|review|rewrite|convert|translate|port|test|tests|"
    r"explain|solve|prove|proof|derive|compute|calculate|evaluate|simplify|integral|"
    r"integrate|equation|expression|formula|latex|matrix|sum|average|mean|median|sort|"
    r"sequence|series|numbers|list|digits|total|count|max|min|pattern|next|wrong|"
    r"above|below|following)\b",
    re.IGNORECASE,
)


def _squeeze(text: str) -> str:
    """A word said four or more times in a row, runs of 8 or more of one symbol, or 16 or
    more of one whitespace character, to one (two for newlines), and a line repeated back to
    back to one copy (indentation and rules such as ``----`` in ordinary text are left
    alone)."""
    text = _REPEATED_WORD.sub(r"\1", text)
    text = _REPEATED_CHAR.sub(
        lambda m: (m.group(1) or m.group(2))[:1] * (1 + ("\n" in m.group(0))), text
    )
    lines: list[str] = []
    for line in text.split("\n"):
        if not lines or line.strip() == "" or line != lines[-1]:
            lines.append(line)
    return "\n".join(lines)


def _inline_maths_end(text: str, start: int, dead: set[str]) -> int | None:
    """Where inline maths opened by the ``$`` at ``start`` ends: the next ``$`` on the same
    line, when a command (``\\frac``) comes before it."""
    if "$" in dead:
        return None
    close = text.find("$", start + 1)
    if close < 0:
        dead.add("$")
        return None
    if text.find("\n", start + 1, close) >= 0 or not _LATEX_COMMAND.search(text, start + 1, close):
        return None
    return close + 1


def _latex_end(text: str, opener: re.Match[str], dead: set[str]) -> int | None:
    """Where the LaTeX block ``opener`` starts ends (``None``: it starts none).

    A closer must follow its opener by at least one character. ``dead`` holds the closers not
    found after an earlier opener: none can follow a later one either, so each is searched for
    at most once per text without success.
    """
    start = opener.start()
    if text[start] == "$":
        if "$$" not in dead and text.startswith("$$", start):
            close = text.find("$$", start + 3)
            if close >= 0:
                return close + 2
            dead.add("$$")
        return _inline_maths_end(text, start, dead)
    name = opener.group(1)
    closer = _BRACKET_CLOSERS[text[start + 1]] if name is None else f"\\end{{{name}}}"
    if closer in dead:
        return None
    close = text.find(closer, opener.end() + 1)
    if close < 0:
        dead.add(closer)
        return None
    return close + len(closer)


def _drop_latex(text: str) -> str:
    """``text`` with each LaTeX block replaced by a space, scanned left to right as a regex
    would (the first block that starts at the earliest place wins), in linear time."""
    pieces: list[str] = []
    dead: set[str] = set()
    kept = pos = 0
    while (opener := _LATEX_OPENER.search(text, pos)) is not None:
        end = _latex_end(text, opener, dead)
        if end is None:
            pos = opener.start() + 1
            continue
        pieces.append(text[kept : opener.start()])
        kept = pos = end
    if not pieces:
        return text
    pieces.append(text[kept:])
    return " ".join(pieces)


def unwrap_text(text: str) -> str:
    """The user's own words of ``text`` (``text`` itself when nothing is packaging, or when
    it is longer than ``UNWRAP_MAX_CHARS``)."""
    if len(text) > UNWRAP_MAX_CHARS:
        return text  # bounded cost on the request path: such a text is scored as sent
    words = _COT.sub(" ", text)
    if words != text:  # what the phrasing leaves: "and", "then", stray punctuation
        words = _LEFTOVER.sub(" ", words)
    outside = _drop_latex(words)
    for pattern in (_FENCE, _NUMBER_RUN):
        outside = pattern.sub(" ", outside)
    if not _REFERS.search(outside):
        words = outside
    words = _squeeze(words).strip()
    if not words or not any(ch.isalnum() for ch in words):
        return text  # all packaging: nothing of the user's own to score instead
    return words if words != text.strip() else text


def _scored(messages: Sequence[Any]) -> int | None:
    """The message the router scores (``features.render``): the last user message, else the
    last message."""
    found = [i for i, m in enumerate(messages) if isinstance(m, Mapping)]
    users = [i for i in found if messages[i].get("role") == "user"]
    return users[-1] if users else (found[-1] if found else None)


def _text(content: Any) -> str | None:
    """A message content's text: a string, or typed parts' texts joined as the router joins
    them (``None``: no text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def _json_object(body: Mapping[str, Any]) -> bool:
    fmt = body.get("response_format")
    return isinstance(fmt, Mapping) and fmt.get("type") == "json_object"


def unwrap(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body to score: ``body`` itself, or a shallow copy with the last user message's
    packaging removed, unusable tools and a ``json_object`` response format dropped."""
    out: dict[str, Any] | None = None
    if body.get("tools") and body.get("tool_choice") == "none":
        out = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    if _json_object(body):
        out = {k: v for k, v in (out or body).items() if k != "response_format"}
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        i = _scored(messages)
        text = _text(messages[i].get("content")) if i is not None else None
        if text is not None:
            unwrapped = unwrap_text(text)
            if unwrapped is not text:
                out = dict(out or body)
                msgs = list(messages)
                msgs[i] = {**msgs[i], "content": unwrapped}  # type: ignore[index]
                out["messages"] = msgs
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):  # the router scores a prompt list's strings joined
            prompt = "\n".join(p for p in prompt if isinstance(p, str))
        if isinstance(prompt, str):
            unwrapped = unwrap_text(prompt)
            if unwrapped is not prompt:
                out = dict(out or body)
                out["prompt"] = unwrapped
    return body if out is None else out
