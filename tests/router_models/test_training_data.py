"""Tests for router_models/training: the labelling rules, the source readers on a real git
repository, and the committed external training file the shipped artifact is trained on."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest

from router_models.records import read_jsonl
from router_models.training import (
    EXTERNAL_TRAIN,
    FOLLOWBENCH_TRAIN,
    MULTI_LOGIEVAL_TRAIN,
    RULE_LABELLED_SOURCES,
    STEPGAME_TRAIN,
    rules,
)
from router_models.training.build import collect, sample
from router_models.training.sources import (
    Repo,
    Row,
    followbench,
    jmmlu,
    multi_logieval,
    stepgame,
    svamp,
)

RESERVED_WORDS = ("gsm8k", "humaneval", "mbpp", "bbh", "logiqa", "alpaca", "ifeval", "jsquad")


@pytest.mark.parametrize(
    ("expression", "ops"),
    [
        ("( 76.0 - 25.0 )", 1),
        ("x=6000/(1+(3/5))", 2),
        ("x=10*5/(5-3)", 3),
        ("x=69.6/8", 1),
        ("$$0.025\\times 0.04=0.001$$", 1),
        ("x=(3/5)", 0),
    ],
)
def test_operations_are_counted_with_fractions_as_numbers(expression: str, ops: int) -> None:
    """A fraction literal is one number; each binary operator between operands is a step."""
    assert rules.count_operations(expression) == ops


def test_rules_decide_or_drop() -> None:
    """One operation is simple, two or more complex, and fields that do not decide drop."""
    assert rules.label_from_operations(1) == "simple"
    assert rules.label_from_operations(2) is None
    assert rules.label_from_operations(3) == "complex"
    assert rules.label_from_operations(0) is None
    assert rules.label_from_subject("anatomy") == "simple"
    assert rules.label_from_subject("college_physics") == "complex"
    assert rules.label_from_subject("elementary_mathematics") is None
    assert rules.label_from_difficulty(0, 1) == "simple"
    assert rules.label_from_difficulty(0, 0) is None
    assert rules.label_from_difficulty(3, 4) == "complex"
    assert rules.label_from_difficulty(2, 2) is None
    assert rules.label_from_difficulty(0, 3) is None
    assert rules.label_from_difficulty(1, 1) is None
    assert rules.label_from_module("numbers__round_number") == "simple"
    assert rules.label_from_module("numbers__round_number_composed") == "complex"
    assert rules.label_from_hops("bridge") is None


def _git_repo(root: Path, files: Mapping[str, str | bytes]) -> Repo:
    work = root / "work"
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (work / name).write_bytes(text)
        else:
            (work / name).write_text(text, encoding="utf-8")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "add", "."], check=True)
    subprocess.run(["git", "-C", str(work), *env, "commit", "-qm", "data"], check=True)
    head = subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return Repo(work / ".git", head)


def test_readers_label_from_the_sources_own_fields(tmp_path: Path) -> None:
    """SVAMP rows are labelled by their equation, JMMLU rows by their subject file."""
    problems = [
        {"ID": "a", "Body": "Tom had 5 apples.", "Question": "He ate 2. How many left?",
         "Equation": "( 5.0 - 2.0 )", "Type": "Subtraction"},
        {"ID": "b", "Body": "Tom had 5 apples and 3 pears.", "Question": "He ate 2 and 1. Left?",
         "Equation": "( ( ( 5.0 + 3.0 ) - 2.0 ) - 1.0 )", "Type": "Subtraction"},
        {"ID": "d", "Body": "Tom had 5 apples and 3 pears.", "Question": "He ate 2. How many?",
         "Equation": "( ( 5.0 + 3.0 ) - 2.0 )", "Type": "Subtraction"},
        {"ID": "c", "Body": "x", "Question": "y", "Equation": "5.0", "Type": "Addition"},
    ]  # fmt: skip
    csv_row = "次の値は?,1,2,3,4,A\n"
    repo = _git_repo(
        tmp_path,
        {
            "SVAMP.json": json.dumps(problems),
            "JMMLU/anatomy.csv": csv_row,
            "JMMLU/college_physics.csv": csv_row,
            "JMMLU/philosophy.csv": csv_row,
            "JMMLU/world_history.csv": csv_row,
        },
    )
    rows = {r.id: r for r in svamp(repo)}
    assert {k: r.label for k, r in rows.items()} == {"svamp-a": "simple", "svamp-b": "complex"}
    assert rows["svamp-a"].prompt == "Tom had 5 apples. He ate 2. How many left?"
    ja = {r.category: r for r in jmmlu(repo)}
    assert {c: r.label for c, r in ja.items()} == {
        "anatomy/ja": "simple",
        "college_physics/ja": "complex",
    }
    assert ja["anatomy/ja"].prompt == "次の値は?\nA. 1\nB. 2\nC. 3\nD. 4"


def test_sampling_caps_each_label_and_drops_repeats() -> None:
    """At most ``cap`` rows per label, chosen the same way every time, repeats kept once."""
    rows = [
        Row(f"s-{i}", "s", "c/en", "simple" if i % 2 else "complex", f"p{i}") for i in range(20)
    ]
    rows.append(Row("s-dup", "s", "c/en", "simple", "P1 "))  # same text as s-1
    seen: set[str] = set()
    first = sample(rows, 4, seen)
    assert Counter(r.label for r in first) == {"simple": 4, "complex": 4}
    assert first == sample(list(reversed(rows)), 4, set())
    assert len({r.prompt.strip().lower() for r in sample(rows, 50, set())}) == 20


def test_missing_repositories_are_skipped(tmp_path: Path) -> None:
    """A mirror root without the repositories yields no rows (and no crash)."""
    assert collect(tmp_path, None) == []


def test_committed_training_file_meets_the_issue() -> None:
    """>= 5,000 prompts, >= 25 % Chinese/Japanese, both labels in every source but svamp
    (one-step only under rule M), labels by rule."""
    records = read_jsonl(EXTERNAL_TRAIN)
    assert len(records) >= 5000
    langs = Counter(r["category"].rsplit("/", 1)[-1] for r in records)
    assert (langs["zh"] + langs["ja"]) / len(records) >= 0.25
    labels = Counter((r["source"], r["label"]) for r in records)
    assert {r["source"] for r in records} == RULE_LABELLED_SOURCES
    for source in RULE_LABELLED_SOURCES:
        assert labels[(source, "simple")] >= 40
        assert labels[(source, "complex")] >= 40 or source == "svamp"
    for r in records:
        field = r["category"].rsplit("/", 1)[0]
        if r["source"] == "jmmlu":
            assert rules.label_from_subject(field) == r["label"]
        elif r["source"] == "dm_mathematics":
            assert rules.label_from_module(field) == r["label"]
        assert not any(word in r["id"].lower() for word in RESERVED_WORDS)
    assert len({r["id"] for r in records}) == len(records)


def test_rule_c_counts_stacked_constraints() -> None:
    """At most one constraint on a simple task is simple, four or more complex, else dropped."""
    assert [rules.label_from_constraints(n) for n in range(7)] == [
        "simple",
        "simple",
        None,
        None,
        "complex",
        "complex",
        "complex",
    ]


def test_followbench_reader_keeps_unreserved_bases_and_labels_by_level(tmp_path: Path) -> None:
    """Levels 0-1 simple, 4-5 complex, 2-3 and reserved or unread bases dropped."""

    def item(source: str, level: int, text: str) -> dict[str, object]:
        return {"example_id": 1, "category": "content", "source": source, "level": level,
                "instruction": text}  # fmt: skip

    mixed = [item("Tedtalks", n, f"Translate, {n} constraints.") for n in range(6)]
    mixed += [item("xsum", 0, "Summarise."), item("Tedtalks", 1, "  ")]
    content = [item("oasst", 5, "Answer with five rules."), item("arxiv", 4, "Four rules.")]
    files = {}
    for folder in ("data", "data_zh"):
        files[f"{folder}/mixed_constraints.json"] = json.dumps(mixed)
        files[f"{folder}/content_constraints.json"] = json.dumps(content)
        files[f"{folder}/situation_constraints.json"] = json.dumps([item("coding", 0, "Code.")])
    rows = {r.id: r for r in followbench(_git_repo(tmp_path, files))}
    assert {k: r.label for k, r in rows.items() if "-en-" in k} == {
        "followbench-en-content-1-4": "complex",
        "followbench-en-mixed-1-0": "simple",
        "followbench-en-mixed-1-1": "simple",
        "followbench-en-mixed-1-4": "complex",
        "followbench-en-mixed-1-5": "complex",
    }
    assert rows["followbench-zh-mixed-1-5"].category == "mixed-level5/zh"
    assert len(rows) == 10


def test_committed_followbench_file_has_both_labels_in_both_languages() -> None:
    """The committed FollowBench rows: labels by rule C, both labels in en and zh."""
    records = read_jsonl(FOLLOWBENCH_TRAIN)
    counts = Counter((r["category"].rsplit("/", 1)[-1], r["label"]) for r in records)
    assert all(
        counts[(lang, label)] >= 20 for lang in ("en", "zh") for label in ("simple", "complex")
    )
    for r in records:
        level = int(r["category"].split("/")[0].rsplit("level", 1)[-1])
        assert rules.label_from_constraints(level) == r["label"]
        assert r["source"] == "followbench"
    assert len({r["id"] for r in records}) == len(records)


def test_rule_s_counts_stated_reasoning_steps() -> None:
    """One stated step is simple, three or more complex, two (and none) dropped."""
    assert [rules.label_from_steps(n) for n in range(7)] == [
        None,
        "simple",
        None,
        "complex",
        "complex",
        "complex",
        "complex",
    ]


def test_stepgame_reader_labels_by_hop_count(tmp_path: Path) -> None:
    """k = 1 simple, k = 3 and 4 complex; k = 2 and the k > 4 files are not read."""

    def hops(k: int) -> str:
        story = [f"A{i} is left of A{i + 1}." for i in range(k)] + ["Z is above Y."]
        return json.dumps({"0": {"story": story, "question": f"Where is A0 from A{k}?",
                                 "label": "left"}})  # fmt: skip

    folder = "Dataset/CompleteVersion/noise"
    files: dict[str, str | bytes] = {f"{folder}/qa{k}_valid.json": hops(k) for k in range(1, 6)}
    rows = {r.id: r for r in stepgame(_git_repo(tmp_path, files))}
    assert {k: r.label for k, r in rows.items()} == {
        "stepgame-k1-0": "simple",
        "stepgame-k3-0": "complex",
        "stepgame-k4-0": "complex",
    }
    assert rows["stepgame-k1-0"].prompt == "A0 is left of A1. Z is above Y.\nWhere is A0 from A1?"
    assert rows["stepgame-k3-0"].category == "hop3/en"


def test_multi_logieval_reader_labels_by_depth_and_reads_cp1252(tmp_path: Path) -> None:
    """Depth d1 simple, d3 and deeper complex, d2 dropped; a Windows-1252 file still reads."""

    def depth(d: int, context: str) -> str:
        return json.dumps({"logic": "pl", "rule": f"R{d}", "depth": f"d{d}",
                           "samples": [{"id": 1, "context": context, "question": "Q?",
                                        "answer": "yes"}]}, ensure_ascii=False)  # fmt: skip

    files: dict[str, str | bytes] = {
        "data/d1_Data/pl/MP.json": depth(1, "If p then q. p."),
        "data/d2_Data/pl/HS_MP.json": depth(2, "Two steps."),
        "data/d3_Data/pl/HS_MP_MP.json": depth(3, "Three steps."),
        "data/d5_Data/pl/X.json": depth(5, "The d\u00e9cor.").encode("cp1252"),
        "data/multivariable_fol_Data/1.json": depth(1, "No depth folder."),
    }
    rows = {r.id: r for r in multi_logieval(_git_repo(tmp_path, files))}
    assert {k: r.label for k, r in rows.items()} == {
        "multi_logieval-pl-R1-d1-1": "simple",
        "multi_logieval-pl-R3-d3-1": "complex",
        "multi_logieval-pl-R5-d5-1": "complex",
    }
    assert rows["multi_logieval-pl-R5-d5-1"].prompt == "The d\u00e9cor.\nQ?"
    assert rows["multi_logieval-pl-R1-d1-1"].category == "pl-d1/en"


@pytest.mark.parametrize(
    ("path", "source"), [(STEPGAME_TRAIN, "stepgame"), (MULTI_LOGIEVAL_TRAIN, "multi_logieval")]
)
def test_committed_rule_s_files_are_balanced_and_labelled_by_rule(path: Path, source: str) -> None:
    """The committed StepGame and Multi-LogiEval rows: 400 per label, labels by rule S."""
    records = read_jsonl(path)
    assert Counter(r["label"] for r in records) == {"simple": 400, "complex": 400}
    for r in records:
        field = r["category"].split("/")[0]
        steps = int(field.removeprefix("hop")) if source == "stepgame" else int(field[-1])
        assert rules.label_from_steps(steps) == r["label"]
        assert r["source"] == source
    assert len({r["id"] for r in records}) == len(records)
