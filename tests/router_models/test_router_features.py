"""Tests for router_models/features.py: rendering, tokens, stable hashing, structure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from router_models.corpus.build import DEFAULT_CORPUS
from router_models.features import (
    _DIGITS,
    _TOKEN_RE,
    AFTER_WEIGHT,
    CHAR_WEIGHT,
    HASH_SIZE,
    MAX_TEXT_CHARS,
    STRUCTURAL_NAMES,
    after_indices,
    extract,
    n_features,
    parts_of,
    render,
    structural,
    token_class,
    tokenize,
)
from router_models.records import body_of, read_jsonl
from router_models.training import EXTERNAL_TRAIN

ROOT = Path(__file__).resolve().parents[2]
BODIES: list[dict[str, Any]] = [
    {"prompt": "Write a function to find the nth Bell number."},
    {"messages": [{"role": "user", "content": "hi there! how's it going?"}]},
    {
        "messages": [
            {"role": "system", "content": "Reply in JSON."},
            {"role": "user", "content": "def f(x):\n    return x ** 2\n\nExplain this."},
        ],
        "max_tokens": 512,
        "response_format": {"type": "json_object"},
    },
]


def _structural(body: dict[str, Any]) -> dict[str, float]:
    rendered = render(body)
    return dict(zip(STRUCTURAL_NAMES, structural(rendered, tokenize(rendered.text)), strict=True))


def test_chat_renders_last_user_message_and_conversation_signals() -> None:
    """Chat bodies score the last user turn and count turns, system, tools and format."""
    body = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "```python\nprint(1)\n```"},
            {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image"}]},
        ],
        "tools": [{"type": "function"}],
        "response_format": {"type": "json_schema"},
        "max_completion_tokens": 300,
    }
    rendered = render(body)
    assert rendered.text == "second"
    assert rendered.user_turns == 2
    assert rendered.has_system
    assert rendered.n_tools == 1
    assert rendered.response_format_json
    assert rendered.max_tokens == 300
    assert _structural(body)["context_has_code"] == 1.0


def test_completion_renders_prompt_string_or_list() -> None:
    """Completion bodies score the prompt, joining a list of strings."""
    assert render({"prompt": ["a", "b"]}).text == "a\nb"
    rendered = render({"prompt": "hello", "max_tokens": True})
    assert rendered.text == "hello"
    assert not rendered.is_chat
    assert rendered.max_tokens is None


def test_malformed_bodies_do_not_raise() -> None:
    """Odd shapes (no messages, non-dict messages, numbers) render to empty text."""
    odd: list[dict[str, Any]] = [{}, {"messages": []}, {"messages": ["x", 3]}, {"prompt": 42}]
    for body in odd:
        assert isinstance(extract(body), dict)


def test_long_text_is_clipped_to_head_and_tail() -> None:
    """Very long prompts keep their head and tail, but the full length is still a signal."""
    text = "start " + "filler " * 5000 + " the question at the end?"
    rendered = render({"prompt": text})
    assert len(rendered.text) <= MAX_TEXT_CHARS + 1
    assert rendered.text.startswith("start")
    assert rendered.text.endswith("the question at the end?")
    assert rendered.full_chars == len(text)


def test_tokens_lowercase_and_digits_folded() -> None:
    """Tokens are lowercased words and punctuation, with every digit turned into 0."""
    assert tokenize("Pay $19.50 NOW!") == ["pay", "$", "00", ".", "00", "now", "!"]
    assert tokenize("Ärger über 3 Bücher") == ["ärger", "über", "0", "bücher"]


def test_feature_indices_are_in_range() -> None:
    """Hashed features land in [0, HASH_SIZE) and structural ones after them."""
    for body in BODIES:
        feats = extract(body)
        assert feats
        assert all(0 <= i < n_features() for i in feats)
        assert any(i >= HASH_SIZE for i in feats)


def test_structural_signals_see_code_json_and_lists() -> None:
    """Code, explicit format requests and list items show up in the structural block."""
    code = _structural(BODIES[2])
    assert code["has_code_def"] == 1.0
    assert code["format_request"] == 1.0
    assert code["response_format_json"] == 1.0
    assert code["has_max_tokens"] == 1.0
    listed = _structural({"prompt": "Do this:\n1. first\n2. second\n- third"})
    assert listed["log_list_items"] > 0
    plain = _structural({"prompt": "hi"})
    assert plain["has_code_def"] == 0.0
    assert plain["format_request"] == 0.0


def test_features_identical_across_processes() -> None:
    """Hashing is stable: another interpreter with a different hash seed gets the same vector."""
    script = (
        "import json, sys\n"
        "from router_models.features import extract\n"
        "bodies = json.loads(sys.stdin.read())\n"
        "print(json.dumps([sorted(extract(b).items()) for b in bodies]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(BODIES),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    ).stdout
    remote = [[(int(i), v) for i, v in row] for row in json.loads(out)]
    local = [sorted(extract(b).items()) for b in BODIES]
    assert remote == local


def test_ascii_fast_path_gives_the_general_tokens() -> None:
    """The ASCII tokeniser shortcut yields exactly the tokens of the general Unicode path."""
    texts = [render(body_of(r)).text for r in read_jsonl(DEFAULT_CORPUS)[:300]]
    texts += ["MiXeD CaSe 123_ABC x=1;y=[2]", "Tabs\tand\nnewlines 9.75%"]
    for text in (t for t in texts if t.isascii()):
        assert tokenize(text) == _TOKEN_RE.findall(text.lower().translate(_DIGITS))


def test_the_unicode_path_folds_exactly_the_ascii_digits_one_to_nine() -> None:
    """The general tokeniser's digit fold (a regex over 1-9) gives the tokens of the reference
    fold (``str.translate`` with ``_DIGITS``) on real Chinese and Japanese text, and leaves
    other scripts' digits (full-width, Arabic-Indic, Devanagari) and superscripts alone."""
    rows = read_jsonl(EXTERNAL_TRAIN)
    texts = [t for t in (render(body_of(r)).text for r in rows[::10]) if not t.isascii()]
    texts += [
        "価格は\uff11\uff12\uff13円、合計 4,560 円です",
        "\u0663 + \u0664 = \u0667 and 3 + 4 = 7",
        "\u0968\u0966 \u00b2 \u2083 0.5",
    ]
    assert len(texts) > 100
    for text in texts:
        assert tokenize(text) == _TOKEN_RE.findall(text.lower().translate(_DIGITS))
    assert tokenize("\uff11\uff12 12") == ["\uff11\uff12", "00"]


PASSAGE = " ".join(["The committee met on Tuesday and reviewed the budget for the year."] * 6)


def test_instruction_words_after_material_get_their_own_features() -> None:
    """With material, each instruction word adds its after-material unigram and char n-grams
    (weight ``AFTER_WEIGHT``); without material, no after-material index appears."""
    question = "When did the committee meet?"
    with_material = extract({"prompt": PASSAGE + "\n" + question})
    alone = extract({"prompt": question})
    _, m_tokens, i_tokens = parts_of(PASSAGE + "\n" + question)
    assert m_tokens
    assert i_tokens == tokenize(question)
    scale = AFTER_WEIGHT / len(i_tokens) ** 0.5
    word, chars = after_indices("committee")
    assert with_material[word] >= scale - 1e-12
    assert all(with_material[i] >= CHAR_WEIGHT * scale - 1e-12 for i in chars)
    assert not any(after_indices(t)[0] in alone for t in tokenize(question))


def test_structural_takes_a_token_count_with_classes() -> None:
    """The scorer passes the number of tokens and their classes: same signals as the list."""
    rendered = render({"prompt": PASSAGE + "\nWhich of the following must be true? (A) x"})
    tokens = tokenize(rendered.text)
    classes = "".join(token_class(t) for t in tokens)
    assert structural(rendered, len(tokens), classes) == structural(rendered, tokens)
