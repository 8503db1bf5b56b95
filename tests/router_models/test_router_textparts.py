"""Tests for router_models/textparts.py and the shape signals of features.py: the
instruction / material split, option lines, code and maths token classes, tech terms."""

from __future__ import annotations

from router_models.features import (
    HASH_SIZE,
    STRUCTURAL_NAMES,
    extract,
    parts_of,
    render,
    structural,
    tokenize,
)
from router_models.textparts import LONG_BLOCK, LONG_LINE, cjk_tech_terms, split_instruction


def _signals(text: str) -> dict[str, float]:
    rendered = render({"prompt": text})
    values = structural(rendered, tokenize(rendered.text))
    return dict(zip(STRUCTURAL_NAMES, values, strict=True))


PASSAGE = " ".join(["The river town grew around a mill and a market by the old bridge."] * 5)


def test_long_line_then_question_splits_off_the_question() -> None:
    """A passage line followed by a short question: the question is the instruction."""
    text = PASSAGE + "\nWhat grew around the mill?"
    material, instruction = split_instruction(text)
    assert material == PASSAGE
    assert instruction.strip() == "What grew around the mill?"
    assert len(PASSAGE) >= LONG_LINE


def test_options_after_a_passage_stay_in_the_instruction() -> None:
    """Question and option lines after a long passage all belong to the instruction."""
    text = PASSAGE + "\nWhich must be true?\nA one\nB two\nC three\nD four"
    material, instruction = split_instruction(text)
    assert material == PASSAGE
    assert instruction.strip().splitlines()[0] == "Which must be true?"
    assert _signals(text)["log_option_lines"] > _signals(PASSAGE + "\nWhich?")["log_option_lines"]
    assert _signals(text)["has_material"] == 1.0


def test_wrapped_prose_cuts_before_the_last_line_but_code_does_not() -> None:
    """Short-line prose over LONG_BLOCK chars splits before its last line; code never does."""
    prose = "\n".join(["a short wrapped line of some story text here"] * 20)
    assert len(prose) >= LONG_BLOCK
    material, instruction = split_instruction(prose + "\nWho is in the story?")
    assert material == prose
    assert instruction.strip() == "Who is in the story?"
    code = "\n".join(["def f(x):", "    return x + 1"] * 30) + "\nFix the bug."
    assert split_instruction(code) == ("", code)


def test_one_long_block_splits_before_its_last_sentence() -> None:
    """A single long paragraph: the final sentence is the instruction."""
    text = PASSAGE * 2 + " Is this review positive or negative?"
    material, instruction = split_instruction(text)
    assert instruction.strip() == "Is this review positive or negative?"
    assert material.rstrip().endswith("bridge.")


def test_short_prompts_are_all_instruction_and_tokens_are_preserved() -> None:
    """No material in short prompts; material + instruction tokens equal the text's tokens."""
    assert split_instruction("how to sort a dict by value") == ("", "how to sort a dict by value")
    for text in (PASSAGE + "\nWhy?", PASSAGE * 2 + " Why so?", "hi"):
        parts, m_tokens, i_tokens = parts_of(text)
        assert m_tokens + i_tokens == tokenize(text)
        assert parts.material_tokens == len(m_tokens)


def test_shape_signals_see_code_and_maths_in_any_language() -> None:
    """Brackets, identifiers with underscores, backticks, maths symbols and programming
    terms count the same in a Russian or an English request; CJK terms by substring."""
    ru = _signals("Как вызвать `my_func(x)` если a + b * 2 в списке?")
    plain = _signals("Как дела у тебя сегодня вечером?")  # noqa: RUF001 - Cyrillic on purpose
    for name in ("log_brackets", "log_underscore_idents", "log_backticks", "log_tech_terms"):
        assert ru[name] > 0.0, name
        assert plain[name] == 0.0, name
    assert ru["math_density"] > plain["math_density"]
    assert cjk_tech_terms("Pandas 文字列の置換") == 1
    assert cjk_tech_terms("東京の天気は?") == 0
    assert _signals("sort a dict in pandas")["log_tech_terms"] > 0.0


def test_passage_words_weigh_little_next_to_the_question() -> None:
    """The material's words land in their own namespace, scaled down; the question's words
    keep the main n-gram block, so two passages with one question share those features."""
    question = "\nWhat grew around the mill?"
    other = " ".join(["A cat sat on the mat and looked at the rain outside today."] * 5)
    a, b = extract({"prompt": PASSAGE + question}), extract({"prompt": other + question})
    alone = extract({"prompt": question.strip()})
    ngram_keys = {k for k in alone if k < HASH_SIZE}
    assert ngram_keys <= set(a)
    assert ngram_keys <= set(b)
    same = sum(abs(a[k] - alone[k]) < 1e-12 for k in ngram_keys)
    assert same >= 0.95 * len(ngram_keys)  # only hash collisions with passage words differ
