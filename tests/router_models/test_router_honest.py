"""Tests for router_models/training/honest.py and crossval.py: held-out evaluation that never lets a
group, or an evaluation-only row, into its own training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router_models.cli import main
from router_models.corpus.build import DEFAULT_CORPUS, HARD_CASES
from router_models.features import HASH_SIZE
from router_models.records import read_jsonl
from router_models.training.crossval import group_of, trainable
from router_models.training.honest import (
    CUES,
    HeldOutReport,
    held_out_report,
    language_of,
    loso_scores,
    reliability,
    with_sources_perfect,
)
from router_models.training.train import Prepared, TrainSettings, prepare, train

pytestmark = pytest.mark.slow


def _small_mix() -> list[dict[str, Any]]:
    corpus = read_jsonl(DEFAULT_CORPUS)[:500]
    external = read_jsonl(HARD_CASES)
    for i, record in enumerate(external):
        record["source"] = "ext_a" if i % 2 else "ext_b"
        record["category"] = "passage/es" if i % 3 == 0 else "passage"
        if i % 5 == 0:
            record["use"] = "eval"
    return corpus + external


@pytest.fixture(scope="module")
def mix() -> Prepared:
    """``_small_mix()`` prepared with the default settings (read only by the tests)."""
    return prepare(_small_mix(), TrainSettings())


@pytest.fixture(scope="module")
def mix_report(mix: Prepared) -> HeldOutReport:
    """The held-out report of ``mix`` with the default settings."""
    return held_out_report(mix, TrainSettings())


def _write(records: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_groups_are_sources_or_corpus_families() -> None:
    """External rows are grouped by source, our corpus by generator family (category)."""
    assert group_of({"source": "xquad", "category": "extractive_qa/en"}) == "xquad"
    assert group_of({"source": "tiergate-gen", "category": "code"}) == "corpus/code"
    assert group_of({"source": "tiergate-hard", "category": "code"}) == "corpus/code"
    assert trainable({"use": "train"})
    assert trainable({})
    assert not trainable({"use": "eval"})
    assert language_of({"category": "so_title/ja"}) == "ja"
    assert language_of({"category": "bbh"}) == "en"


def test_eval_rows_never_shape_the_artifact(tmp_path: Path) -> None:
    """Flipping the labels of ``use: eval`` rows (or dropping them) changes no weight."""
    records = _small_mix()
    flipped = [
        {**r, "label": "simple" if r["label"] == "complex" else "complex"}
        if r.get("use") == "eval"
        else r
        for r in records
    ]
    kept = [r for r in records if r.get("use") != "eval"]
    weighted = TrainSettings(external_weight=1.0)  # external train rows do count here
    a = train([_write(records, tmp_path / "a.jsonl")], weighted)
    b = train([_write(flipped, tmp_path / "b.jsonl")], weighted)
    c = train([_write(kept, tmp_path / "c.jsonl")], weighted)
    for other in (b, c):
        assert np.array_equal(a.hashed_index, other.hashed_index)
        assert np.array_equal(a.hashed_weight, other.hashed_weight)
        assert (a.platt_a, a.platt_c) == (other.platt_a, other.platt_c)


def test_external_weight_zero_ignores_external_rows(tmp_path: Path) -> None:
    """With the default weight 0 the external rows change no weight of the model."""
    corpus = read_jsonl(DEFAULT_CORPUS)[:500]
    with_external = train([_write(_small_mix(), tmp_path / "mix.jsonl")])
    alone = train([_write(corpus, tmp_path / "corpus.jsonl")])
    assert np.array_equal(with_external.hashed_index, alone.hashed_index)
    assert np.allclose(with_external.hashed_weight, alone.hashed_weight, atol=1e-9)


def test_held_out_report_covers_every_source_and_family(
    mix: Prepared, mix_report: HeldOutReport
) -> None:
    """LOSO scores every external row, LOFO every corpus family, with cue checks."""
    data, report = mix, mix_report
    assert {g.name for g in report.loso_sources} == {"ext_a", "ext_b"}
    assert sum(g.n for g in report.loso_sources) == len(read_jsonl(HARD_CASES))
    families = {g for g in data.groups if g.startswith("corpus/")}
    assert {g.name for g in report.lofo_families} == families
    assert {g.name for g in report.loso_languages} == {"en", "es"}
    for rel in (report.loso, report.lofo):
        assert 0.5 < rel.roc_auc <= 1.0
        assert 0.0 <= rel.brier <= 1.0
        assert 0.0 <= rel.ece <= 1.0
    assert {c.name for c in report.cues} <= {c.name for c in CUES}
    assert any(c.name.startswith("strip trailing") for c in report.cues)


def test_loso_scores_and_the_perfect_source_counterfactual(
    mix: Prepared, mix_report: HeldOutReport
) -> None:
    """``loso_scores`` are the report's LOSO predictions; scoring sources perfectly helps."""
    data = mix
    scores = loso_scores(data, TrainSettings())
    rows = np.flatnonzero(~np.isnan(scores))
    assert rows.size == len(read_jsonl(HARD_CASES))
    assert all(not data.groups[i].startswith("corpus/") for i in rows)
    y = data.y[rows].astype(np.int_)
    groups = [data.groups[i] for i in rows]
    base = reliability(y, scores[rows])
    assert base.roc_auc == pytest.approx(mix_report.loso.roc_auc)
    assert with_sources_perfect(groups, y, scores[rows], frozenset()) == base
    one = with_sources_perfect(groups, y, scores[rows], {"ext_a"})
    assert one.roc_auc >= base.roc_auc
    every = with_sources_perfect(groups, y, scores[rows], {"ext_a", "ext_b"})
    assert (every.roc_auc, every.simple_sent_at_95, every.brier) == (1.0, 0.0, 0.0)


def test_reliability_of_perfect_and_constant_predictions() -> None:
    """Brier and ECE are 0 for certain, correct predictions and 0.25 / 0 for p = base rate."""
    y = np.array([0, 0, 1, 1])
    perfect = reliability(y, np.array([0.0, 0.0, 1.0, 1.0]))
    assert (perfect.brier, perfect.ece, perfect.roc_auc) == (0.0, 0.0, 1.0)
    half = reliability(y, np.full(4, 0.5))
    assert half.brier == pytest.approx(0.25)
    assert half.ece == pytest.approx(0.0)
    assert half.roc_auc == 0.5


def test_cli_held_out_json(tmp_path: Path) -> None:
    """``eval --held-out --train-data`` prints the LOSO and LOFO figures as JSON."""
    data = _write(_small_mix(), tmp_path / "mix.jsonl")
    import io

    out = io.StringIO()
    assert main(["eval", "--held-out", "--train-data", str(data), "--json"], out=out) == 0
    result = json.loads(out.getvalue())["held_out"]
    assert {"loso", "loso_sources", "loso_languages", "cues", "lofo", "lofo_families"} <= set(
        result
    )


def test_external_rows_can_be_kept_out_of_the_hashed_fits() -> None:
    """``external_hashed=False``: fits see external rows' structural block only; scoring
    (``x``) still sees every feature, and corpus rows are untouched."""
    data = prepare(_small_mix(), TrainSettings(external_weight=1.0, external_hashed=False))
    external = np.array([not g.startswith("corpus/") for g in data.groups])
    assert data.x_fit[external][:, :HASH_SIZE].nnz == 0
    assert data.x[external][:, :HASH_SIZE].nnz > 0
    assert (data.x_fit[~external] != data.x[~external]).nnz == 0
    assert (data.x_fit[:, HASH_SIZE:] != data.x[:, HASH_SIZE:]).nnz == 0
    same = prepare(_small_mix()[:50], TrainSettings())
    assert same.x_fit is same.x


def test_calibration_weight_of_external_rows_is_its_own_setting(mix: Prepared) -> None:
    """``calibration_external_weight`` sets external rows' weight in the Platt fit only: the
    fit weights stay ``external_weight`` and corpus rows weigh 1 in the calibration."""
    off = mix
    on = prepare(_small_mix(), TrainSettings(calibration_external_weight=1.0))
    external = np.array([not g.startswith("corpus/") for g in on.groups])
    assert external.any()
    assert (~external).any()
    assert (off.calib_weight[external] == 0).all()
    assert (on.calib_weight[external] == 1).all()
    assert (on.calib_weight[~external] == 1).all()
    assert (on.weight == off.weight).all()
