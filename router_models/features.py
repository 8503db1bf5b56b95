"""Features for the tier router: hashed n-grams plus structural signals.

One definition serves training and serving.  ``extract(body)`` turns an OpenAI chat or
completion request body into a sparse vector ``{index: value}``; the lean scorer reuses the
same primitives (``render``, ``parts_of``, ``tokenize``, ``word_hash``, ``char_indices``,
``bigram_index``, ``material_index``, ``structural``), and a test checks both paths agree, so
they cannot drift.

The scored text is first split (``textparts.split_instruction``) into *material* (a pasted
passage, article or specification) and the *instruction* (the request itself: the question,
the imperative, the asked-for format).  Prompts without long material are all instruction.

Layout of the vector (``FEATURE_SPEC`` records it in every artifact; its ``name`` identifies
the feature space):

* ``[0, HASH_SIZE)``: hashed word unigrams, word bigrams and character 3-5-grams (of the UTF-8
  bytes, inside word boundaries: the word padded with one space each side) of the
  *instruction*, plus "edge" unigrams: its first and last ``EDGE_TOKENS`` tokens hashed with
  their own seed.  Unigram and bigram counts are scaled by ``1/sqrt(tokens)``, character
  n-gram counts by ``CHAR_WEIGHT/sqrt(tokens)`` (so a word's whole contribution is one number
  the scorer can cache), edge counts by ``1/sqrt(edge tokens)``.  The *material* adds only
  unigrams hashed with ``MATERIAL_SEED``, scaled by ``MATERIAL_WEIGHT/sqrt(material tokens)``:
  its size and shape matter (structural block), its vocabulary barely.  When material is
  present, the instruction's unigrams and character n-grams are added once more under
  ``AFTER_SEED``, scaled by ``AFTER_WEIGHT``: the model can weigh a word differently when it
  asks about a passage.
* ``[HASH_SIZE, HASH_SIZE + len(STRUCTURAL_NAMES))``: structural signals in roughly [0, 1],
  including the material's size, option lines, and script-independent code and maths shape
  (operators, brackets, identifiers with underscores or in camelCase, dotted names, calls,
  backticks, maths-symbol and digit density, programming terms).

Hashes are CRC-32 (``zlib.crc32``) and a fixed multiplicative mix, identical in every process;
Python's salted ``hash()`` is never used.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from router_models.textparts import TECH_TERMS, cjk_tech_terms, split_instruction

HASH_BITS: Final = 18
HASH_SIZE: Final = 1 << HASH_BITS
HASH_SHIFT: Final = 32 - HASH_BITS
CHAR_NGRAM_MIN: Final = 3
CHAR_NGRAM_MAX: Final = 5
# Weight of character n-grams against word n-grams (chosen by leave-one-family-out over the
# corpus and by a selection over router-dev2's trainable sources; see docs/router.md).
CHAR_WEIGHT: Final = 0.6
EDGE_TOKENS: Final = 16
EDGE_SEED: Final = 0x45444745
MATERIAL_SEED: Final = 0x4D415452
MATERIAL_WEIGHT: Final = 0.3
# Instruction words seen again, under their own seed, when material precedes them (the
# same word after a pasted passage is a different signal: a look-up over the passage versus
# a deduction from it).  Weight chosen over router-dev2's trainable rows within a band of
# leave-one-family-out AUC; see docs/router.md, "Instruction words after material (v7)".
AFTER_SEED: Final = 0x41465452
AFTER_WEIGHT: Final = 0.7
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
    "has_material",
    "log_material_chars",
    "log_material_lines",
    "log_instruction_chars",
    "log_instruction_tokens",
    "log_option_lines",
    "log_brackets",
    "log_underscore_idents",
    "log_backticks",
    "math_density",
    "number_density",
    "log_tech_terms",
)

FEATURE_SPEC: Final[dict[str, Any]] = {
    "name": "tiergate-hashed-v7",
    "hash": "crc32",
    "hash_bits": HASH_BITS,
    "word_ngrams": [1, 2],
    "char_ngrams_wb": [CHAR_NGRAM_MIN, CHAR_NGRAM_MAX],
    "char_weight": CHAR_WEIGHT,
    "edge_unigrams": EDGE_TOKENS,
    "split": "material = text up to the last line of >= 200 chars (or all but the last "
    "sentence of a single >= 600-char block); n-grams and edges from the instruction only",
    "material_unigrams": {"seed": MATERIAL_SEED, "weight": MATERIAL_WEIGHT},
    "after_material": {
        "what": "instruction unigrams + char n-grams again when material is present",
        "seed": AFTER_SEED,
        "weight": AFTER_WEIGHT,
    },
    "text": "last user message (chat) or prompt (completion), lowercased, digits as 0",
    "max_text_chars": MAX_TEXT_CHARS,
    "structural": list(STRUCTURAL_NAMES),
}

_TOKEN_RE: Final = re.compile(r"\w+|[^\w\s]")
_ASCII_TOKEN_RE: Final = re.compile(r"[a-z0-9_]+|[^a-z0-9_\s]")
# The definition of the digit fold ("every digit replaced by 0"): ASCII 1-9 only.  The
# tokeniser applies it with ``_NONZERO_DIGIT_RE`` (the same code points): ``str.translate``
# looks every character up in a dict once the text is not ASCII, 47 µs against 7 µs on a
# 1 KB Chinese or Japanese prompt (docs/router.md, "Scoring cost").
_DIGITS: Final = str.maketrans("123456789", "000000000")
_NONZERO_DIGIT_RE: Final = re.compile("[1-9]")
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
_OPTION_LETTERS: Final = frozenset("ABCDEabcde")
_OPTION_HEADS: Final = frozenset("ABCDEabcde(")
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
CLASS_SENTENCE, CLASS_QUESTION, CLASS_FORMAT, CLASS_TECH = "s", "q", "f", "t"
CLASS_BRACKET, CLASS_MATH, CLASS_BACKTICK, CLASS_IDENT = "b", "m", "g", "u"
_TOKEN_CLASSES: Final = {
    **dict.fromkeys(TECH_TERMS, CLASS_TECH),
    **dict.fromkeys("()", CLASS_BRACKET),
    **dict.fromkeys("+*/^%\u00d7\u00f7\u2212\u221a\u2264\u2265\u2260", CLASS_MATH),
    "`": CLASS_BACKTICK,
    "?": CLASS_QUESTION,
    **dict.fromkeys(_SENTENCE_TOKENS, CLASS_SENTENCE),
    **dict.fromkeys(_CODE_TOKENS, CLASS_CODE),
    **dict.fromkeys(_CONSTRAINT_TOKENS, CLASS_CONSTRAINT),
    **dict.fromkeys(_FORMAT_TOKENS, CLASS_FORMAT),
}
# fmt: on


class Rendered(NamedTuple):
    """The parts of a request body that the features look at (a tuple: cheap to build on
    the request path)."""

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
    return _TOKEN_RE.findall(_NONZERO_DIGIT_RE.sub("0", text.lower()))


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


def after_indices(token: str) -> tuple[int, list[int]]:
    """Hashed indices of ``token``'s unigram and character 3-5-grams under ``AFTER_SEED``
    (the instruction word seen after material)."""
    data = token.encode("utf-8")
    padded = b" " + data + b" "
    size = len(padded)
    chars: list[int] = []
    for n in range(CHAR_NGRAM_MIN, CHAR_NGRAM_MAX + 1):
        seed = AFTER_SEED ^ n
        chars.extend(zlib.crc32(padded[i : i + n], seed) >> HASH_SHIFT for i in range(size - n + 1))
    return zlib.crc32(data, AFTER_SEED) >> HASH_SHIFT, chars


def _log(value: float, scale: float) -> float:
    return math.log1p(value) / scale


def _is_option(head: str) -> bool:
    """``A. ...``, ``B) ...``, ``C: ...``, ``D ...`` or ``(E) ...``: a multiple-choice line."""
    if head[:1] == "(":
        return head[1:2] in _OPTION_LETTERS and head[2:3] == ")"
    sep = head[1:2]
    return head[:1] in _OPTION_LETTERS and (sep in (".", ")", ":") or (sep == " " and head < "a"))


def _line_signals(text: str) -> tuple[int, int, bool, int]:
    """Indented lines, bulleted or numbered lines, whether a line starts like code, and
    multiple-choice option lines."""
    indented = items = options = 0
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
        if head[0] in _OPTION_HEADS and _is_option(head):
            options += 1
    return indented, items, code, options


def _has_latex(text: str) -> bool:
    """LaTeX commands or inline ``$...$`` maths (regex only when a marker is present)."""
    return ("\\" in text or "$" in text) and _LATEX_RE.search(text) is not None


def _has_code(text: str) -> bool:
    return "```" in text or _line_signals(text)[2]


def token_class(token: str) -> str:
    """The structural class of a token (one character, ``CLASS_*``)."""
    if token[0] == "0":
        return CLASS_NUMBER
    if "_" in token and len(token) > 1 and token not in _TOKEN_CLASSES:
        return CLASS_IDENT  # an identifier_with_underscores
    return _TOKEN_CLASSES.get(token, CLASS_NONE)


class Parts(NamedTuple):
    """The instruction / material split of a text and the material's token count."""

    material: str
    instruction: str
    material_tokens: int


def parts_of(text: str) -> tuple[Parts, list[str], list[str]]:
    """The split of ``text`` with the material's and the instruction's tokens."""
    material, instruction = split_instruction(text)
    m_tokens = tokenize(material) if material else []
    i_tokens = tokenize(instruction)
    return Parts(material, instruction, len(m_tokens)), m_tokens, i_tokens


def _shape_signals(
    text: str, parts: Parts, classes: str, n_tokens: int, options: int
) -> tuple[float, ...]:
    """The instruction/material and code/maths shape block of ``structural``."""
    per_token = 1.0 / max(1, n_tokens)
    code_math = classes.count(CLASS_MATH) + classes.count(CLASS_CODE)
    return (
        1.0 if parts.material else 0.0,
        _log(len(parts.material), 10.0),
        _log(parts.material.count("\n"), 5.0),
        _log(len(parts.instruction), 8.0),
        _log(n_tokens - parts.material_tokens, 6.0),
        _log(options, 2.0),
        _log(classes.count(CLASS_BRACKET), 4.0),
        _log(classes.count(CLASS_IDENT), 3.0),
        _log(classes.count(CLASS_BACKTICK), 3.0),
        min(1.0, 4.0 * code_math * per_token),
        min(1.0, 4.0 * classes.count(CLASS_NUMBER) * per_token),
        _log(classes.count(CLASS_TECH) + cjk_tech_terms(text), 3.0),
    )


def structural(
    r: Rendered, tokens: list[str] | int, classes: str | None = None, parts: Parts | None = None
) -> tuple[float, ...]:
    """Structural signals of a rendered request, in ``STRUCTURAL_NAMES`` order.

    ``tokens`` are the text's tokens (material first, then instruction), or only their number
    when ``classes`` is given; ``classes`` is ``"".join(token_class(t) for t in tokens)`` and
    ``parts`` the text's ``parts_of`` split: the scorer passes both, training lets them be
    computed here.
    """
    text = r.text
    if isinstance(tokens, int):
        n_tokens = tokens
        if classes is None:
            raise ValueError("structural() needs the tokens or their classes")
    else:
        n_tokens = len(tokens)
        if classes is None:
            classes = "".join(token_class(t) for t in tokens)
    if parts is None:
        parts = parts_of(text)[0]
    indented, items, code_def, options = _line_signals(text)
    stripped = text.rstrip()
    wants_format = CLASS_FORMAT in classes
    if not wants_format and r.system:
        system = r.system.lower()
        wants_format = any(w in system for w in _FORMAT_WORDS)
    questions = classes.count(CLASS_QUESTION)
    return (
        _log(r.full_chars, 10.0),
        _log(n_tokens, 8.0),
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
        *_shape_signals(text, parts, classes, n_tokens, options),
    )


def _add(feats: SparseFeatures, index: int, value: float) -> None:
    feats[index] = feats.get(index, 0.0) + value


def material_index(token: str) -> int:
    """Hashed-space index of a word of the material (pasted passage) part."""
    return zlib.crc32(token.encode("utf-8"), MATERIAL_SEED) >> HASH_SHIFT


class WordMemo:
    """Each word's character n-gram indices, computed once (a corpus repeats its words: 9,000
    prompts hold ~250,000 instruction words but ~15,000 distinct ones). ``featurize`` shares
    one across a data set; ``extract`` makes one per request. The indices, and the order in
    which their values are added, are those of ``char_indices`` and ``after_indices``, so the
    vector is the same to the last bit."""

    __slots__ = ("after", "chars")

    def __init__(self) -> None:
        self.chars: dict[str, tuple[int, ...]] = {}
        self.after: dict[str, tuple[int, tuple[int, ...]]] = {}

    def chars_of(self, token: str) -> tuple[int, ...]:
        """``char_indices(token)``."""
        found = self.chars.get(token)
        if found is None:
            found = self.chars[token] = tuple(char_indices(token))
        return found

    def after_of(self, token: str) -> tuple[int, tuple[int, ...]]:
        """``after_indices(token)``."""
        found = self.after.get(token)
        if found is None:
            word, chars = after_indices(token)
            found = self.after[token] = (word, tuple(chars))
        return found


def _add_all(feats: SparseFeatures, indices: Sequence[int], value: float) -> None:
    """``_add`` of ``value`` at each of ``indices``, in order (the hot loop, inlined)."""
    get = feats.get
    for i in indices:
        feats[i] = get(i, 0.0) + value


def _add_ngrams(feats: SparseFeatures, tokens: list[str], memo: WordMemo) -> None:
    """Word unigrams, bigrams and character n-grams of the instruction tokens."""
    word_scale = 1.0 / math.sqrt(max(1, len(tokens)))
    hashes = [word_hash(t) for t in tokens]
    _add_all(feats, [unigram_index(h) for h in hashes], word_scale)
    _add_all(feats, [bigram_index(a, b) for a, b in itertools.pairwise(hashes)], word_scale)
    char_scale = CHAR_WEIGHT * word_scale
    for t in tokens:
        _add_all(feats, memo.chars_of(t), char_scale)


def extract(body: Mapping[str, Any], memo: WordMemo | None = None) -> SparseFeatures:
    """Sparse feature vector ``{index: value}`` of an OpenAI request body (``memo``: word
    n-grams already computed, shared across many bodies; the result does not depend on it)."""
    memo = memo if memo is not None else WordMemo()
    rendered = render(body)
    parts, m_tokens, i_tokens = parts_of(rendered.text)
    feats: SparseFeatures = {}
    _add_ngrams(feats, i_tokens, memo)
    if m_tokens:
        material_scale = MATERIAL_WEIGHT / math.sqrt(len(m_tokens))
        _add_all(feats, [material_index(t) for t in m_tokens], material_scale)
        if i_tokens:
            after_scale = AFTER_WEIGHT / math.sqrt(len(i_tokens))
            for t in i_tokens:
                word, chars = memo.after_of(t)
                _add(feats, word, after_scale)
                _add_all(feats, chars, CHAR_WEIGHT * after_scale)
    edges = edge_tokens(i_tokens)
    _add_all(feats, [edge_index(t) for t in edges], 1.0 / math.sqrt(max(1, len(edges))))
    for j, value in enumerate(structural(rendered, m_tokens + i_tokens, parts=parts)):
        if value:
            feats[HASH_SIZE + j] = value
    return feats


def n_features() -> int:
    """Total length of the feature vector."""
    return HASH_SIZE + len(STRUCTURAL_NAMES)
