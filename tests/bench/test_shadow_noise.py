"""Tests for bench/shadow/noise.py: label noise flips whole prompts in a copy of the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.shadow.noise import noisy_copy


def _store(path: Path, prompts: int, records_each: int) -> list[dict[str, object]]:
    records = [
        {"prompt_digest": f"d{i}", "agreement": 0.9 if i % 2 else 0.1, "n": n}
        for i in range(prompts)
        for n in range(records_each)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_noise_flips_every_record_of_a_chosen_prompt_and_about_the_asked_share(
    tmp_path: Path,
) -> None:
    """At 30 %, each prompt is flipped in all its records or in none; about 30 % are flipped."""
    clean = _store(tmp_path / "store.jsonl", prompts=1000, records_each=2)
    counts = noisy_copy(tmp_path / "store.jsonl", 0.3, 1, tmp_path / "noisy.jsonl")
    noisy = _read(tmp_path / "noisy.jsonl")
    assert len(noisy) == len(clean)
    flipped: dict[object, set[bool]] = {}
    for before, after in zip(clean, noisy, strict=True):
        assert after["prompt_digest"] == before["prompt_digest"]
        changed = after["agreement"] != before["agreement"]
        if changed:
            assert after["agreement"] == 1.0 - float(before["agreement"])  # type: ignore[arg-type]
        flipped.setdefault(before["prompt_digest"], set()).add(changed)
    assert all(len(states) == 1 for states in flipped.values())
    assert counts == {"prompts": 1000, "flipped": sum(True in s for s in flipped.values())}
    assert 250 <= counts["flipped"] <= 350


def test_no_noise_leaves_the_store_alone_and_seeds_pick_other_prompts(tmp_path: Path) -> None:
    """Level 0 flips nothing; two seeds at one level flip different prompt sets."""
    clean = _store(tmp_path / "store.jsonl", prompts=200, records_each=1)
    assert noisy_copy(tmp_path / "store.jsonl", 0.0, 1, tmp_path / "zero.jsonl")["flipped"] == 0
    assert _read(tmp_path / "zero.jsonl") == clean
    noisy_copy(tmp_path / "store.jsonl", 0.2, 1, tmp_path / "a.jsonl")
    noisy_copy(tmp_path / "store.jsonl", 0.2, 2, tmp_path / "b.jsonl")
    assert _read(tmp_path / "a.jsonl") != _read(tmp_path / "b.jsonl")


def test_noise_flips_the_judge_label_of_the_same_prompts(tmp_path: Path) -> None:
    """A flipped prompt's judge score crosses 0.625 (score 4+ -> 0.0, 3- -> 1.0); null stays."""
    scores = [1.0, 0.75, 0.5, 0.0, None]
    records: list[dict[str, Any]] = [
        {"prompt_digest": f"d{i}", "agreement": 0.9, "judge": scores[i % 5]} for i in range(500)
    ]
    (tmp_path / "store.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8"
    )
    noisy_copy(tmp_path / "store.jsonl", 0.5, 1, tmp_path / "noisy.jsonl")
    opposite = {1.0: 0.0, 0.75: 0.0, 0.5: 1.0, 0.0: 1.0, None: None}
    flipped_from = []
    for before, after in zip(records, _read(tmp_path / "noisy.jsonl"), strict=True):
        if after["agreement"] != before["agreement"]:  # this prompt was flipped
            assert after["judge"] == opposite[before["judge"]]
            flipped_from.append(before["judge"])
        else:
            assert after["judge"] == before["judge"]
    assert set(flipped_from) == set(scores)
    assert 200 <= len(flipped_from) <= 300
