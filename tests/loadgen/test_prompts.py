"""Prompt sources: deterministic synthetic prompts and the user's JSONL file."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from loadgen.prompts import load_jsonl, synthetic
from loadgen.spec import SpecError
from simulator.tokenize import count_tokens


def test_synthetic_prompts_are_seeded_and_never_repeat() -> None:
    """Same seed: same words; every prompt has its own head, so no two share a prefix."""
    first = [p.text or "" for p in islice(synthetic(200, 1, "run-a"), 3)]
    again = [p.text or "" for p in islice(synthetic(200, 1, "run-b"), 3)]
    other = [p.text or "" for p in islice(synthetic(200, 2, "run-a"), 3)]
    assert len(set(first)) == 3
    assert [t.split(":", 1)[1] for t in first] == [t.split(":", 1)[1] for t in again]
    assert first != other
    assert first[0].split(":", 1)[0] != first[1].split(":", 1)[0]
    assert first[0].split(":", 1)[0] != again[0].split(":", 1)[0]


def test_synthetic_prompt_length_is_close_to_the_ask() -> None:
    """A 512-token prompt is 512 tokens within a few (simulator tokenizer)."""
    prompt = next(synthetic(512, 0, "x"))
    assert prompt.text is not None
    assert abs(count_tokens(prompt.text) - 512) <= 8


def test_jsonl_prompts_and_messages(tmp_path: Path) -> None:
    """Lines may hold a prompt or chat messages; blank lines are skipped."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    prompts = load_jsonl(path, chat=True)
    assert prompts[0].chat_messages() == [{"role": "user", "content": "hello"}]
    assert prompts[1].chat_messages() == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "ok"}\n{"prompt": \n', r"p\.jsonl:2: not JSON"),
        ('["a list"]\n', r"p\.jsonl:1: expected a JSON object"),
        ('{"text": "x"}\n', r"p\.jsonl:1: expected a non-empty string `prompt`"),
        ('{"messages": []}\n', r"p\.jsonl:1: `messages` must be"),
        ('{"messages": [{"content": "no role"}]}\n', r"p\.jsonl:1: `messages` must be"),
        ("\n\n", "has no prompts"),
    ],
)
def test_bad_jsonl_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    """Each bad file is refused with its path, line number and what is wrong."""
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_jsonl(path, chat=True)


def test_jsonl_messages_need_chat_and_file_must_exist(tmp_path: Path) -> None:
    """Messages cannot go to /v1/completions; a missing or binary file is a clear error."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(SpecError, match="needs --endpoint chat"):
        load_jsonl(path, chat=False)
    with pytest.raises(SpecError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl", chat=True)
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_jsonl(path, chat=True)
