"""Features for the tier router: hashed n-grams plus structural signals.

One definition serves training and serving.  ``extract(body)`` turns an OpenAI chat or
completion request body into a sparse vector ``{index: value}``; the lean scorer reuses the
same primitives (``render``, ``tokenize``, ``word_hash``, ``char_indices``,
``bigram_index``, ``structural``), and a test checks both paths agree, so they cannot drift.

Layout of the vector (``FEATURE_SPEC`` records it in every artifact):

* ``[0, HASH_SIZE)``: hashed word unigrams, word bigrams and character 3-5-grams taken inside
  word boundaries (the word padded with one space each side).  Unigram and bigram counts are
  scaled by ``1/sqrt(tokens)``, character n-gram counts by ``1/sqrt(char n-grams)``.
* ``[HASH_SIZE, HASH_SIZE + len(STRUCTURAL_NAMES))``: structural signals in roughly [0, 1].

Hashes are CRC-32 (``zlib.crc32``) and a fixed multiplicative mix, identical in every process;
Python's salted ``hash()`` is never used.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

HASH_BITS: Final = 18
HASH_SIZE: Final = 1 << HASH_BITS
HASH_SHIFT: Final = 32 - HASH_BITS
CHAR_NGRAM_MIN: Final = 3
CHAR_NGRAM_MAX: Final = 5
MAX_TEXT_CHARS: Final = 6000
HEAD_CHARS: Final = 4000
TAIL_CHARS: Final = 2000
MASK32: Final = 0xFFFFFFFF
BIGRAM_MUL_A: Final = 0x9E3779B1
BIGRAM_MUL_B: Final = 0x85EBCA77
BIGRAM_ADD: Final = 0x165667B1

SparseFeatures = dict[int, float]

STRUCTURAL_NAMES: Final = (
    "log_chars",
    "log_tokens",
    "log_lines",
    "log_numbers",
    "has_latex",
    "has_code_fence",
    "log_code_marks",
    "log_indented_lines",
    "has_code_def",
    "format_request",
    "log_list_items",
    "log_constraint_words",
    "log_questions",
    "log_sentences",
    "log_last_paragraph",
    "log_user_turns",
    "has_system",
    "log_system_chars",
    "context_has_code",
    "log_context_chars",
    "has_max_tokens",
    "log_max_tokens",
    "response_format_json",
    "has_tools",
    "is_chat",
)

FEATURE_SPEC: Final[dict[str, Any]] = {
    "name": "tiergate-hashed-v2",
    "hash": "crc32",
    "hash_bits": HASH_BITS,
    "word_ngrams": [1, 2],
    "char_ngrams_wb": [CHAR_NGRAM_MIN, CHAR_NGRAM_MAX],
    "text": "last user message (chat) or prompt (completion), lowercased, digits as 0",
    "max_text_chars": MAX_TEXT_CHARS,
    "structural": list(STRUCTURAL_NAMES),
}

_TOKEN_RE: Final = re.compile(r"\w+|[^\w\s]")
_ASCII_TOKEN_RE: Final = re.compile(r"[a-z0-9_]+|[^a-z0-9_\s]")
_DIGITS: Final = str.maketrans("123456789", "000000000")
_LATEX_RE: Final = re.compile(
    r"\\(?:frac|sqrt|sum|int|cdot|times|le|ge|pi|alpha|theta)|\$[^$\n]+\$"
)
# fmt: off
_CODE_STARTS: Final = (
    "def ", "class ", "function", "fn ", "func ", "public ", "private ", "import ", "#include",
    "select ", "SELECT ", "package ", "const ", "let ", "var ", "return ", "for (", "if (",
)
_BULLETS: Final = ("- ", "* ", "\u2022 ")
_CODE_TOKENS: Final = frozenset("{};=[]<>|&\\")
_FORMAT_TOKENS: Final = frozenset(("json", "yaml", "xml", "csv", "schema", "jsonl"))
_FORMAT_WORDS: Final = tuple(sorted(_FORMAT_TOKENS))
_CONSTRAINT_TOKENS: Final = frozenset((
    "must", "exactly", "only", "each", "every", "least", "most", "ensure", "without", "strictly",
    "never", "always",
))
_SENTENCE_TOKENS: Final = (".", "!", "?")
# fmt: on


@dataclass(frozen=True, slots=True)
class Rendered:
    """The parts of a request body that the features look at."""

    text: str
    full_chars: int
    system: str
    context: str
    user_turns: int
    system_chars: int
    has_system: bool
    max_tokens: int | None
    response_format_json: bool
    n_tools: int
    is_chat: bool


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string or a list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _clip(text: str) -> str:
    """Keep the head and tail of very long texts so scoring cost stays bounded."""
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _wants_json(body: Mapping[str, Any]) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and str(fmt.get("type", "")).startswith("json"):
        return True
    return any(body.get(k) for k in ("guided_json", "structured_outputs"))


def render(body: Mapping[str, Any]) -> Rendered:
    """Pick the scored text and the whole-conversation signals out of a request body."""
    messages = body.get("messages")
    tools = body.get("tools") or body.get("functions")
    n_tools = len(tools) if isinstance(tools, Sequence) else 0
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        msgs = [m for m in messages if isinstance(m, Mapping)]
        users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
        last = users[-1] if users else len(msgs) - 1
        text = _content_text(msgs[last].get("content")) if msgs else ""
        system = "\n".join(
            _content_text(m.get("content"))
            for m in msgs
            if m.get("role") in ("system", "developer")
        )
        others = [_content_text(m.get("content")) for i, m in enumerate(msgs) if i != last]
        context = "\n".join(others)
        is_chat = True
    else:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = "\n".join(p for p in prompt if isinstance(p, str))
        text = prompt if isinstance(prompt, str) else ""
        system, context, users, is_chat = "", "", [0], False
    return Rendered(
        text=_clip(text),
        full_chars=len(text),
        system=_clip(system),
        context=_clip(context),
        user_turns=len(users),
        system_chars=len(system),
        has_system=bool(system),
        max_tokens=_max_tokens(body),
        response_format_json=_wants_json(body),
        n_tools=n_tools,
        is_chat=is_chat,
    )


def tokenize(text: str) -> list[str]:
    """Lowercased word and punctuation tokens, every digit replaced by ``0``."""
    lowered = text.lower().translate(_DIGITS)
    # Same tokens either way; the ASCII pattern is just faster.
    pattern = _ASCII_TOKEN_RE if lowered.isascii() else _TOKEN_RE
    return pattern.findall(lowered)


def word_hash(token: str) -> int:
    """Stable 32-bit hash of a token (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(token.encode("utf-8"))


def unigram_index(token_hash: int) -> int:
    """Hashed-space index of a word unigram."""
    return token_hash >> HASH_SHIFT


def bigram_index(first: int, second: int) -> int:
    """Hashed-space index of a word bigram from its two token hashes."""
    mixed = (first * BIGRAM_MUL_A + second * BIGRAM_MUL_B + BIGRAM_ADD) & MASK32
    return mixed >> HASH_SHIFT


def char_indices(token: str) -> list[int]:
    """Hashed indices of the character 3-5-grams of ``token`` (padded with spaces)."""
    padded = f" {token} ".encode()
    size = len(padded)
    out: list[int] = []
    for n in range(CHAR_NGRAM_MIN, CHAR_NGRAM_MAX + 1):
        out.extend(zlib.crc32(padded[i : i + n], n) >> HASH_SHIFT for i in range(size - n + 1))
    return out


def _log(value: float, scale: float) -> float:
    return math.log1p(value) / scale


def _line_signals(text: str) -> tuple[int, int, bool]:
    """Indented lines, bulleted or numbered lines, and whether a line starts like code."""
    indented = items = 0
    code = False
    for line in text.split("\n"):
        head = line.lstrip()
        if not head:
            continue
        if len(head) < len(line):
            indented += 1
        if head.startswith(_CODE_STARTS):
            code = True
        rest = head.lstrip("0123456789")
        if head.startswith(_BULLETS) or (len(rest) < len(head) and rest[:2] in (". ", ") ")):
            items += 1
    return indented, items, code


def _has_latex(text: str) -> bool:
    """LaTeX commands or inline ``$...$`` maths (regex only when a marker is present)."""
    return ("\\" in text or "$" in text) and _LATEX_RE.search(text) is not None


def _has_code(text: str) -> bool:
    return "```" in text or _line_signals(text)[2]


def _count(counts: Counter[str], vocabulary: Iterable[str]) -> int:
    return sum(counts[t] for t in vocabulary if t in counts)


def structural(r: Rendered, tokens: list[str]) -> tuple[float, ...]:
    """Structural signals of a rendered request, in ``STRUCTURAL_NAMES`` order."""
    text = r.text
    counts = Counter(tokens)
    numbers = sum(n for t, n in counts.items() if t[0] == "0")
    indented, items, code_def = _line_signals(text)
    stripped = text.rstrip()
    system = r.system.lower()
    wants_format = any(t in counts for t in _FORMAT_TOKENS)
    wants_format = wants_format or any(w in system for w in _FORMAT_WORDS)
    return (
        _log(r.full_chars, 10.0),
        _log(len(tokens), 8.0),
        _log(text.count("\n"), 5.0),
        _log(numbers, 4.0),
        1.0 if _has_latex(text) else 0.0,
        1.0 if "```" in text else 0.0,
        _log(_count(counts, _CODE_TOKENS), 5.0),
        _log(indented, 4.0),
        1.0 if code_def else 0.0,
        1.0 if wants_format else 0.0,
        _log(items, 3.0),
        _log(_count(counts, _CONSTRAINT_TOKENS), 3.0),
        _log(counts["?"], 3.0),
        _log(_count(counts, _SENTENCE_TOKENS), 4.0),
        _log(len(stripped) - stripped.rfind("\n") - 1, 8.0),
        _log(r.user_turns, 3.0),
        1.0 if r.has_system else 0.0,
        _log(r.system_chars, 8.0),
        1.0 if _has_code(r.context) else 0.0,
        _log(len(r.context), 10.0),
        1.0 if r.max_tokens is not None else 0.0,
        _log(r.max_tokens or 0, 10.0),
        1.0 if r.response_format_json else 0.0,
        _log(r.n_tools, 2.0),
        1.0 if r.is_chat else 0.0,
    )


def _add(feats: SparseFeatures, index: int, value: float) -> None:
    feats[index] = feats.get(index, 0.0) + value


def extract(body: Mapping[str, Any]) -> SparseFeatures:
    """Sparse feature vector ``{index: value}`` of an OpenAI request body."""
    rendered = render(body)
    tokens = tokenize(rendered.text)
    feats: SparseFeatures = {}
    word_scale = 1.0 / math.sqrt(max(1, len(tokens)))
    hashes = [word_hash(t) for t in tokens]
    for h in hashes:
        _add(feats, unigram_index(h), word_scale)
    for first, second in itertools.pairwise(hashes):
        _add(feats, bigram_index(first, second), word_scale)
    chars = [i for t in tokens for i in char_indices(t)]
    char_scale = 1.0 / math.sqrt(max(1, len(chars)))
    for i in chars:
        _add(feats, i, char_scale)
    for j, value in enumerate(structural(rendered, tokens)):
        if value:
            feats[HASH_SIZE + j] = value
    return feats


def n_features() -> int:
    """Total length of the feature vector."""
    return HASH_SIZE + len(STRUCTURAL_NAMES)
