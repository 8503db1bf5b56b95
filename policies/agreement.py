"""How far two answers to the same prompt agree (shadow evaluation, issue 17).

Pure functions over the two answer texts, each in ``[0, 1]``:

- short answers (both at most ``SHORT_WORDS`` words): normalized exact match — lower case,
  punctuation, articles and extra whitespace removed (the SQuAD normalization);
- JSON answers (both parse as objects or arrays): parsed and compared, the share of leaf
  paths with equal values over the union of paths;
- other text: the mean of token-level F1 and the longest-common-subsequence ratio (ROUGE-L F).

``method`` names the measure used, so metrics can be broken down by it.

Answers with tool calls (``content: null`` beside ``tool_calls``, as vLLM's tool-call
parsers answer) come as their content followed by each call, written with
:func:`tool_call_text`; two such answers are compared as JSON (each call's name and parsed
arguments), and a call against words does not agree at all (method ``tool_calls``). Two
answers with nothing in them (a reasoning model that thought until ``max_tokens``) have
nothing to compare: method ``empty``, which shadow evaluation does not record.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

SHORT_WORDS = 4
_MAX_LCS_TOKENS = 400  # LCS is quadratic: compare the first 400 tokens of long answers
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
# Where a tool call starts in an answer's text, and where its name ends: control characters
# (record and unit separators) that answers' words do not hold.
TOOL_CALL: Final = "\x1e"
TOOL_ARGUMENTS: Final = "\x1f"
EMPTY: Final = "empty"  # the method of two answers with nothing to compare


@dataclass(frozen=True, slots=True)
class Agreement:
    """A score in [0, 1] and the measure that produced it."""

    score: float
    method: str


def normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def tokens(text: str) -> list[str]:
    """The normalized words of ``text``."""
    return normalize(text).split()


def token_f1(a: list[str], b: list[str]) -> float:
    """Token-overlap F1 (bag of words)."""
    if not a and not b:
        return 1.0
    common = sum((Counter(a) & Counter(b)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(b)
    return 2 * precision * recall / (precision + recall)


def lcs_ratio(a: list[str], b: list[str]) -> float:
    """ROUGE-L F-measure: the longest common subsequence over both lengths."""
    a, b = a[:_MAX_LCS_TOKENS], b[:_MAX_LCS_TOKENS]
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    lcs = previous[-1]
    return 2 * lcs / (len(a) + len(b))


def _parse_json(text: str) -> Any:
    stripped = _FENCE.sub("", text.strip())
    if not stripped or stripped[0] not in "{[":
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    return value if isinstance(value, dict | list) else None


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{path}.{key}"))
        return out or {path: {}}
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(_leaves(item, f"{path}[{index}]"))
        return out or {path: []}
    if isinstance(value, str):
        return {path: normalize(value)}
    return {path: value}


def json_agreement(a: Any, b: Any) -> float:
    """The share of leaf paths present in both with equal values, over all leaf paths."""
    left, right = _leaves(a), _leaves(b)
    paths = left.keys() | right.keys()
    if not paths:
        return 1.0
    same = sum(1 for p in paths if p in left and p in right and left[p] == right[p])
    return same / len(paths)


def tool_call_text(name: str | None, arguments: str) -> str:
    """A tool call's place in an answer's text: where it starts (with its ``name``; a streamed
    call's later pieces have none and go on the one before), then its ``arguments``."""
    start = TOOL_CALL + name + TOOL_ARGUMENTS if name else ""
    return start + arguments


def readable(text: str) -> str:
    """An answer's text as a reader (the judge) sees it: each tool call on a line of its own,
    ``[tool call] name arguments``."""
    return text.replace(TOOL_CALL, "\n[tool call] ").replace(TOOL_ARGUMENTS, " ").strip()


def _calls(text: str) -> dict[str, Any] | None:
    """An answer with tool calls as JSON: its content (when any) and each call's name and
    arguments (parsed when they are JSON); ``None`` for an answer without calls."""
    content, *calls = text.split(TOOL_CALL)
    if not calls:
        return None
    parsed: list[dict[str, Any]] = []
    for call in calls:
        name, _, arguments = call.partition(TOOL_ARGUMENTS)
        try:
            value = json.loads(arguments)
        except ValueError:
            value = arguments
        parsed.append({"name": name, "arguments": value})
    return {"content": content, "tool_calls": parsed} if content.strip() else {"tool_calls": parsed}


def agreement(a: str, b: str) -> Agreement:
    """How far answers ``a`` and ``b`` agree, with the measure suited to their shape."""
    if not a.strip() and not b.strip():
        return Agreement(0.0, EMPTY)
    calls_a, calls_b = _calls(a), _calls(b)
    if calls_a is not None or calls_b is not None:  # a call against words: 0
        same = json_agreement(calls_a, calls_b) if calls_a and calls_b else 0.0
        return Agreement(same, "tool_calls")
    parsed_a, parsed_b = _parse_json(a), _parse_json(b)
    if parsed_a is not None and parsed_b is not None:
        return Agreement(json_agreement(parsed_a, parsed_b), "json")
    if (parsed_a is None) != (parsed_b is None) and (
        a.strip()[:1] in "{[" or b.strip()[:1] in "{["
    ):
        return Agreement(0.0, "json")  # one answer is valid JSON, the other is not
    ta, tb = tokens(a), tokens(b)
    if len(ta) <= SHORT_WORDS and len(tb) <= SHORT_WORDS:
        return Agreement(1.0 if ta == tb else 0.0, "exact")
    return Agreement((token_f1(ta, tb) + lcs_ratio(ta, tb)) / 2, "text")
