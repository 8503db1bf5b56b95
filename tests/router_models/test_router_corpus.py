"""Tests for the corpus in router_models/corpus: reproducible, labelled, varied, our own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from router_models.corpus.build import DEFAULT_CORPUS, HARD_CASES, build, write
from router_models.records import body_of, label_of, read_jsonl
from tests.shared_data import SHARED_DATASETS, needs_shared

DEV = SHARED_DATASETS / "router-dev.jsonl"
DEV2 = SHARED_DATASETS / "router-dev2.jsonl"


def _text(record: dict[str, object]) -> str:
    body = body_of(record)
    if "messages" in body:
        return "\n".join(str(m.get("content", "")) for m in body["messages"])
    return str(body["prompt"])


def test_committed_corpus_is_what_the_generator_writes(tmp_path: Path) -> None:
    """Regenerating with the default seed reproduces the committed JSONL byte for byte."""
    write(build(), tmp_path / "corpus.jsonl")
    assert (tmp_path / "corpus.jsonl").read_bytes() == DEFAULT_CORPUS.read_bytes()


def test_corpus_size_labels_and_categories() -> None:
    """At least 3,000 labelled examples, both labels well represented, every category used."""
    records = read_jsonl(DEFAULT_CORPUS) + read_jsonl(HARD_CASES)
    assert len(records) >= 3000
    labels = Counter(label_of(r) for r in records)
    assert min(labels.values()) >= 0.35 * len(records)
    categories = {r["category"] for r in records}
    for needed in (
        "chitchat",
        "factual_qa",
        "rewrite",
        "classification",
        "extraction",
        "translation",
        "summarize_short",
        "math_multistep",
        "code",
        "reasoning",
        "json_output",
        "long_analysis",
    ):
        assert needed in categories


def test_corpus_covers_the_hard_shapes() -> None:
    """Multi-turn chats, system prompts, JSON response formats and long easy prompts exist."""
    records = read_jsonl(DEFAULT_CORPUS) + read_jsonl(HARD_CASES)
    chats = [r for r in records if "messages" in r]
    assert sum(1 for r in chats if len(r["messages"]) > 2) >= 200
    assert sum(1 for r in chats if r["messages"][0]["role"] == "system") >= 300
    assert sum(1 for r in records if "response_format" in r) >= 50
    long_easy = [r for r in records if label_of(r) == 0 and len(_text(r)) > 600]
    short_hard = [r for r in records if label_of(r) == 1 and len(_text(r)) < 120]
    assert len(long_easy) >= 100
    assert len(short_hard) >= 100


def test_prompts_are_mostly_distinct() -> None:
    """Templates do not collapse into repeats: over 95 % of bodies are unique."""
    records = read_jsonl(DEFAULT_CORPUS)
    assert len({_text(r) for r in records}) >= 0.95 * len(records)


def _shingles(text: str, size: int = 10) -> set[str]:
    words = text.lower().split()
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


@pytest.mark.parametrize(
    "external",
    [
        pytest.param(DEV, marks=needs_shared("datasets/router-dev.jsonl"), id="router-dev"),
        pytest.param(DEV2, marks=needs_shared("datasets/router-dev2.jsonl"), id="router-dev2"),
    ],
)
def test_no_external_prompt_is_copied(external: Path) -> None:
    """No corpus prompt shares a 10-word run with an external set (dev2: train rows too)."""
    dev: set[str] = set()
    for record in read_jsonl(external):
        dev |= _shingles(str(record["prompt"]))
    ours = read_jsonl(DEFAULT_CORPUS) + read_jsonl(HARD_CASES)
    overlaps = [r["id"] for r in ours if _shingles(_text(r)) & dev]
    assert overlaps == []


@needs_shared("datasets/router-dev2.jsonl")
def test_no_external_prompt_is_in_the_repository() -> None:
    """No tracked text file holds a short external prompt or a 10-word run of a long one."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    listed = (
        subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    texts = []
    for name in listed:
        path = root / name
        if name and path.suffix in {".py", ".md", ".jsonl", ".json", ".txt", ".yaml"}:
            texts.append(path.read_text(encoding="utf-8", errors="replace").lower())
    blob = "\n".join(texts)
    blob_runs = _shingles(blob)
    leaked = []
    for record in read_jsonl(DEV2):
        prompt = " ".join(str(record["prompt"]).lower().split())
        words = prompt.split()
        if len(words) >= 10:
            hit = bool(_shingles(prompt) & blob_runs)
        else:
            hit = len(prompt) >= 50 and prompt in blob  # shorter ones are generic phrases
        if hit:
            leaked.append(record["id"])
    assert leaked == []


def _non_latin(text: str) -> bool:
    return any(ord(ch) > 0x3FF for ch in text)


def test_script_and_passage_presence_carry_both_labels() -> None:
    """Short non-Latin-script prompts and long prompts that end in a lettered choice exist
    with both labels, each at least 50 times, so neither shape predicts the label."""
    records = read_jsonl(DEFAULT_CORPUS)
    short_script = Counter(
        label_of(r) for r in records if len(_text(r)) < 120 and _non_latin(_text(r))
    )
    long_choice = Counter(
        label_of(r)
        for r in records
        if len(_text(r)) > 600 and ("\nA. " in _text(r) or " A. " in _text(r))
    )
    assert min(short_script[0], short_script[1]) >= 50
    assert min(long_choice[0], long_choice[1]) >= 50


def test_contrast_pairs_are_single_families() -> None:
    """The multilingual and passage families hold both labels, so leaving one family out
    removes both halves of its contrast together."""
    records = read_jsonl(DEFAULT_CORPUS)
    for family in ("multilingual", "passage_logic", "choice_puzzles", "math_multistep"):
        labels = Counter(label_of(r) for r in records if r["category"] == family)
        assert min(labels[0], labels[1]) >= 100


def test_word_problems_carry_both_labels_in_english_chinese_and_japanese() -> None:
    """One-step word problems (simple) sit in the multi-step problems' family in all three
    languages, and Chinese and Japanese have multi-step (complex) problems of their own, so a
    word problem's look or language does not give its label (router round 16b)."""
    records = [r for r in read_jsonl(DEFAULT_CORPUS) if r["category"] == "math_multistep"]

    def script(text: str) -> str:
        if any("\u3040" <= ch <= "\u30ff" for ch in text):
            return "ja"
        return "zh" if any("\u4e00" <= ch <= "\u9fff" for ch in text) else "en"

    counts = Counter((script(_text(r).rsplit("\n", 1)[-1]), label_of(r)) for r in records)
    for language in ("en", "zh", "ja"):
        assert counts[(language, 0)] >= 100, counts
    for language in ("zh", "ja"):
        assert counts[(language, 1)] >= 90, counts


@pytest.mark.parametrize("language", ["en", "zh", "ja"])
def test_one_step_templates_name_at_most_two_quantities(language: str) -> None:
    """A one-step problem's template fills at most two number slots (the operands of its one
    operation); the multi-step templates of the same language fill at least two and ask more
    of them (checked by reading, in phrases/arith_multi_*.txt)."""
    import string

    from router_models.corpus.lexicon import phrases

    words = {"a", "b", "item", "food"}
    for template in phrases(f"arith_one_{language}"):
        slots = {name for _, name, _, _ in string.Formatter().parse(template) if name}
        assert 1 <= len(slots - words) <= 2, template
