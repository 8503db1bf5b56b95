"""Features for the tier router: hashed n-grams plus structural signals.

One definition serves training and serving.  ``extract(body)`` turns an OpenAI chat or
completion request body into a sparse vector ``{index: value}``; the lean scorer reuses the
same primitives (``render``, ``tokenize``, ``word_hash``, ``char_indices``,
``bigram_index``, ``structural``), and a test checks both paths agree, so they cannot drift.

Layout of the vector (``FEATURE_SPEC`` records it in every artifact):

* ``[0, HASH_SIZE)``: hashed word unigrams, word bigrams and character 3-5-grams taken inside
  word boundaries (the word padded with one space each side), plus "edge" unigrams: the first
  and last ``EDGE_TOKENS`` tokens hashed with their own seed, because that is where the
  request itself usually sits around a pasted passage.  Unigram and bigram counts are scaled by
  ``1/sqrt(tokens)``, character n-gram counts by ``CHAR_WEIGHT/sqrt(tokens)`` (so a word's
  whole contribution is one number the scorer can cache), edge counts by
  ``1/sqrt(edge tokens)``.
* ``[HASH_SIZE, HASH_SIZE + len(STRUCTURAL_NAMES))``: structural signals in roughly [0, 1].

Hashes are CRC-32 (``zlib.crc32``) and a fixed multiplicative mix, identical in every process;
Python's salted ``hash()`` is never used.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

HASH_BITS: Final = 18
HASH_SIZE: Final = 1 << HASH_BITS
HASH_SHIFT: Final = 32 - HASH_BITS
CHAR_NGRAM_MIN: Final = 3
CHAR_NGRAM_MAX: Final = 5
CHAR_WEIGHT: Final = 0.3
EDGE_TOKENS: Final = 16
EDGE_SEED: Final = 0x45444745
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
    "name": "tiergate-hashed-v4",
    "hash": "crc32",
    "hash_bits": HASH_BITS,
    "word_ngrams": [1, 2],
    "char_ngrams_wb": [CHAR_NGRAM_MIN, CHAR_NGRAM_MAX],
    "char_weight": CHAR_WEIGHT,
    "edge_unigrams": EDGE_TOKENS,
    "text": "last user message (chat) or prompt (completion), lowercased, digits as 0",
    "max_text_chars": MAX_TEXT_CHARS,
    "structural": list(STRUCTURAL_NAMES),
}

_TOKEN_RE: Final = re.compile(r"\w+|[^\w\s]")
_ASCII_TOKEN_RE: Final = re.compile(r"[a-z0-9_]+|[^a-z0-9_\s]")
_DIGITS: Final = str.maketrans("123456789", "000000000")
_ASCII_FOLD: Final = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456789", b"abcdefghijklmnopqrstuvwxyz000000000"
)
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
    "must", "exactly", "only", "each", "every", "least", "ensure", "without", "strictly",
    "never", "always",
))
_SENTENCE_TOKENS: Final = frozenset((".", "!"))
# One character per token for the structural counts (the scorer caches it per word).
CLASS_NONE, CLASS_NUMBER, CLASS_CODE, CLASS_CONSTRAINT = "-", "n", "c", "k"
CLASS_SENTENCE, CLASS_QUESTION, CLASS_FORMAT = "s", "q", "f"
_TOKEN_CLASSES: Final = {
    "?": CLASS_QUESTION,
    **dict.fromkeys(_SENTENCE_TOKENS, CLASS_SENTENCE),
    **dict.fromkeys(_CODE_TOKENS, CLASS_CODE),
    **dict.fromkeys(_CONSTRAINT_TOKENS, CLASS_CONSTRAINT),
    **dict.fromkeys(_FORMAT_TOKENS, CLASS_FORMAT),
}
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
    if text.isascii():
        # Same tokens as the general path below, about twice as fast for ASCII text.
        return _ASCII_TOKEN_RE.findall(text.encode().translate(_ASCII_FOLD).decode())
    return _TOKEN_RE.findall(text.lower().translate(_DIGITS))


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


def edge_index(token: str) -> int:
    """Hashed-space index of a token seen at the start or end of the text."""
    return zlib.crc32(token.encode("utf-8"), EDGE_SEED) >> HASH_SHIFT


def edge_tokens(tokens: list[str]) -> list[str]:
    """The first and last ``EDGE_TOKENS`` tokens (all tokens, once, for short texts)."""
    if len(tokens) <= 2 * EDGE_TOKENS:
        return tokens
    return tokens[:EDGE_TOKENS] + tokens[-EDGE_TOKENS:]


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


def token_class(token: str) -> str:
    """The structural class of a token (one character, ``CLASS_*``)."""
    return CLASS_NUMBER if token[0] == "0" else _TOKEN_CLASSES.get(token, CLASS_NONE)


def structural(r: Rendered, tokens: list[str], classes: str | None = None) -> tuple[float, ...]:
    """Structural signals of a rendered request, in ``STRUCTURAL_NAMES`` order.

    ``classes`` is ``"".join(token_class(t) for t in tokens)``; the scorer passes it from its
    word cache, training lets it be computed here.
    """
    text = r.text
    if classes is None:
        classes = "".join(token_class(t) for t in tokens)
    indented, items, code_def = _line_signals(text)
    stripped = text.rstrip()
    wants_format = CLASS_FORMAT in classes
    wants_format = wants_format or any(w in r.system.lower() for w in _FORMAT_WORDS)
    questions = classes.count(CLASS_QUESTION)
    return (
        _log(r.full_chars, 10.0),
        _log(len(tokens), 8.0),
        _log(text.count("\n"), 5.0),
        _log(classes.count(CLASS_NUMBER), 4.0),
        1.0 if _has_latex(text) else 0.0,
        1.0 if "```" in text else 0.0,
        _log(classes.count(CLASS_CODE), 5.0),
        _log(indented, 4.0),
        1.0 if code_def else 0.0,
        1.0 if wants_format else 0.0,
        _log(items, 3.0),
        _log(classes.count(CLASS_CONSTRAINT), 3.0),
        _log(questions, 3.0),
        _log(classes.count(CLASS_SENTENCE) + questions, 4.0),
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
    char_scale = CHAR_WEIGHT * word_scale
    for t in tokens:
        for i in char_indices(t):
            _add(feats, i, char_scale)
    edges = edge_tokens(tokens)
    edge_scale = 1.0 / math.sqrt(max(1, len(edges)))
    for t in edges:
        _add(feats, edge_index(t), edge_scale)
    for j, value in enumerate(structural(rendered, tokens)):
        if value:
            feats[HASH_SIZE + j] = value
    return feats


def n_features() -> int:
    """Total length of the feature vector."""
    return HASH_SIZE + len(STRUCTURAL_NAMES)
