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
    assert data["comparison"]["tenant_weighted"] is True  # one tenant (unknown): weights all 1
    assert data["comparison"]["tenant_balance"]["tenants"] == 1
    assert "tenant-weighted as in training (1 tenant, largest 100% of rows" in printed
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


def judged(prompt: str, agreement: float, judge: float | None) -> dict[str, Any]:
    """A store line with the precise tier's rubric score of the fast answer (or none)."""
    return record(prompt, agreement) | {"judge": judge}


def test_judge_labels_come_from_the_mean_rubric_score_of_judged_records(tmp_path: Path) -> None:
    """Below 0.625 (score 3 of 5 or lower) is complex; unjudged prompts are left out."""
    store = write_store(
        tmp_path / "s.jsonl",
        [
            judged(SIMPLE[0], 0.0, 1.0),  # agreement says complex, the judge says equivalent
            judged(SIMPLE[0], 0.0, None),  # not judged: the mean is over judged records only
            judged(SIMPLE[1], 1.0, 0.75),  # score 4: simple
            judged(COMPLEX[0], 1.0, 0.5),  # score 3: complex
            judged(COMPLEX[1], 1.0, 0.75),
            judged(COMPLEX[1], 1.0, 0.25),  # mean 0.5: complex
            judged(COMPLEX[2], 0.0, None),  # never judged: left out
            record(COMPLEX[3], 0.0),  # written before the judge field existed: left out
        ],
    )
    by_agreement = read_shadow(store_files(store))
    by_judge = read_shadow(store_files(store), label="judge")
    assert len(by_agreement.digests) == 6
    assert by_judge.records == 8
    labels = dict(zip(by_judge.digests, by_judge.y.tolist(), strict=True))
    digest = {p: record(p, 0.0)["prompt_digest"] for p in SIMPLE[:2] + COMPLEX[:2]}
    assert labels == {
        digest[SIMPLE[0]]: 0.0,
        digest[SIMPLE[1]]: 0.0,
        digest[COMPLEX[0]]: 1.0,
        digest[COMPLEX[1]]: 1.0,
    }
    agreement = dict(zip(by_judge.digests, by_judge.agreement.tolist(), strict=True))
    assert agreement[digest[SIMPLE[0]]] == 0.0  # kept from both records, for the quality curve
    stricter = read_shadow(store_files(store), label="judge", judge_at=0.8)
    assert dict(zip(stricter.digests, stricter.y.tolist(), strict=True))[digest[SIMPLE[1]]] == 1.0
    with pytest.raises(ValueError, match="label"):
        read_shadow(store_files(store), label="rubric")


def test_shadow_label_judge_trains_on_the_rubric_score(tmp_path: Path) -> None:
    """Agreement and judge disagree on every prompt: the flag decides what is learned."""
    records = [judged(p, 0.0, 1.0) for p in SIMPLE] + [judged(p, 1.0, 0.25) for p in COMPLEX]
    records[0]["judge"] = None  # one prompt never judged
    store = write_store(tmp_path / "shadow.jsonl", records)
    body = {p: {"messages": [{"role": "user", "content": p}]} for p in (SIMPLE[-1], COMPLEX[-1])}
    margins = {}
    for label in ("agreement", "judge"):
        out, text = tmp_path / f"{label}.npz", io.StringIO()
        args = ["train", "--from-shadow", str(store), "--out", str(out), "--shadow-weight", "3"]
        assert main([*args, "--shadow-label", label], out=text) == 0
        router = router_models.load(out)
        margins[label] = router.score(body[COMPLEX[-1]]) - router.score(body[SIMPLE[-1]])
        prompts = 60 if label == "agreement" else 59
        assert f"60 records (0 stale), {prompts} prompts" in text.getvalue()
        shadow_meta = router.metadata["shadow"]
        assert shadow_meta.get("label", "agreement") == label
    assert margins["judge"] > 0 > margins["agreement"]
    with pytest.raises(SystemExit):
        main(["train", "--from-shadow", str(store), "--shadow-label", "x"])


def test_the_documented_training_defaults() -> None:
    """docs/savings.md: agreement below 0.5 is complex, a fifth of the prompts is held out,
    a shadow prompt weighs 1.0, three calibration folds, judge labels below 0.625."""
    from router_models.training.shadow_train import ShadowSettings

    settings = ShadowSettings()
    assert (settings.agree_at, settings.held_out_share, settings.shadow_weight) == (0.5, 0.2, 1.0)
    assert (settings.folds, settings.label, settings.judge_at) == (3, "agreement", 0.625)
