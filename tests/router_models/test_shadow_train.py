"""Training from shadow records: feature vectors and agreement, never prompt text."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import router_models
from router_models.cli import main
from router_models.training.shadow_train import (
    held_out_mask,
    read_shadow,
    store_files,
)
from router_models.vectors import feature_space, hashed_vector

pytestmark = pytest.mark.slow

SIMPLE = [f"Name the colour of fruit number {i} in one word." for i in range(30)]
COMPLEX = [f"Derive a closed form for recurrence {i} and prove it by induction." for i in range(30)]


def record(prompt: str, agreement: float, *, space: str | None = None) -> dict[str, Any]:
    """A store line as the gateway writes it (the digest stands in for the prompt)."""
    vector = hashed_vector({"messages": [{"role": "user", "content": prompt}]})
    return {
        "at": 0.0,
        "direction": "fast_on_precise",
        "tier": "fast",
        "shadow_tier": "precise",
        "score": 0.3,
        "agreement": agreement,
        "method": "f1",
        "prompt_digest": hashlib.sha256(prompt.encode()).hexdigest()[:24],
        "feature_space": space or vector.space,
        "artifact": "sha256:x",
        "features": {"index": list(vector.index), "value": list(vector.value)},
        "prompt": None,
    }


def write_store(path: Path, records: list[dict[str, Any]]) -> Path:
    """A JSON-lines store."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_records_merge_by_prompt_and_stale_spaces_are_skipped(tmp_path: Path) -> None:
    """Two records of one prompt average; another feature space or no vector is stale."""
    store = write_store(
        tmp_path / "s.jsonl",
        [
            record(SIMPLE[0], 1.0),
            record(SIMPLE[0], 0.8),
            record(COMPLEX[0], 0.1),
            record(COMPLEX[1], 0.1, space="tiergate-hashed-v0:000000000000"),
            {"prompt_digest": "x", "agreement": 1.0},
        ],
    )
    shadow = read_shadow(store_files(store))
    assert shadow.records == 5
    assert shadow.stale == 2
    assert len(shadow.digests) == 2
    assert sorted(shadow.agreement.tolist()) == pytest.approx([0.1, 0.9])
    assert sorted(shadow.y.tolist()) == [0.0, 1.0]
    assert all(v.space == feature_space() for v in shadow.vectors)


def test_the_rotated_half_is_read_first(tmp_path: Path) -> None:
    """``STORE.1`` (older records) comes before ``STORE``; a missing store is an error."""
    store = tmp_path / "s.jsonl"
    with pytest.raises(FileNotFoundError):
        store_files(store)
    write_store(store, [record(SIMPLE[0], 1.0)])
    write_store(tmp_path / "s.jsonl.1", [record(SIMPLE[1], 1.0)])
    assert store_files(store) == [tmp_path / "s.jsonl.1", store]


def test_the_held_out_split_is_a_stable_hash() -> None:
    """The same digests are always held out, about the share asked for."""
    digests = [f"digest-{i}" for i in range(2000)]
    mask = held_out_mask(digests, 0.2)
    assert np.array_equal(mask, held_out_mask(digests, 0.2))
    assert 0.17 < mask.mean() < 0.23


def test_train_from_shadow_writes_a_loadable_artifact_and_compares(tmp_path: Path) -> None:
    """The CLI learns from vectors alone, reports old vs new, and the gateway's loader reads it."""
    records = [record(p, 1.0) for p in SIMPLE] + [record(p, 0.05) for p in COMPLEX]
    store = write_store(tmp_path / "shadow.jsonl", records)
    out, report = tmp_path / "new.npz", tmp_path / "report.json"
    text = io.StringIO()
    args = ["train", "--from-shadow", str(store), "--out", str(out), "--report", str(report)]
    assert main([*args, "--held-out-share", "0.3"], out=text) == 0
    printed = text.getvalue()
    assert "60 records (0 stale), 60 prompts" in printed
    assert "simple sent" in printed
    data = json.loads(report.read_text(encoding="utf-8"))
    assert data["artifact"]["id"] == router_models.artifact_digest(out)
    assert data["comparison"]["rows"] == 60 - data["train_prompts"]
    router = router_models.load(out)
    assert router.metadata["shadow"]["prompts"] == data["train_prompts"]
    assert router.metadata["shadow"]["base_artifact"] == data["base_artifact"]
    complex_body = {"messages": [{"role": "user", "content": COMPLEX[-1]}]}
    simple_body = {"messages": [{"role": "user", "content": SIMPLE[-1]}]}
    assert router.score(complex_body) > router.score(simple_body)


def test_train_from_shadow_never_overwrites_the_shipped_artifact(tmp_path: Path) -> None:
    """Without --out the shipped artifact would be replaced: refused with status 2."""
    store = write_store(tmp_path / "s.jsonl", [record(SIMPLE[0], 1.0)])
    before = router_models.DEFAULT_ARTIFACT.read_bytes()
    assert main(["train", "--from-shadow", str(store)], out=io.StringIO()) == 2
    assert router_models.DEFAULT_ARTIFACT.read_bytes() == before
