"""Tests for router_models/artifact.py: deterministic, pickle-free, validated loading."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import router_models
from router_models.artifact import ArtifactError, RouterModel, load, save
from router_models.features import FEATURE_SPEC, HASH_SIZE, STRUCTURAL_NAMES


def _model(seed: int = 0) -> RouterModel:
    rng = np.random.default_rng(seed)
    index = np.sort(rng.choice(HASH_SIZE, size=50, replace=False)).astype(np.int32)
    return RouterModel(
        hashed_index=index,
        hashed_weight=rng.normal(size=50),
        structural_weight=rng.normal(size=len(STRUCTURAL_NAMES)),
        intercept=0.25,
        platt_a=1.5,
        platt_c=-0.1,
        metadata={"feature_spec": FEATURE_SPEC, "default_threshold": 0.5},
    )


def test_round_trip_preserves_weights_and_metadata(tmp_path: Path) -> None:
    """What is saved is loaded back exactly."""
    path = tmp_path / "m.npz"
    original = _model()
    save(original, path)
    loaded = load(path)
    assert np.array_equal(loaded.hashed_index, original.hashed_index)
    assert np.array_equal(loaded.hashed_weight, original.hashed_weight)
    assert np.array_equal(loaded.structural_weight, original.structural_weight)
    assert (loaded.intercept, loaded.platt_a, loaded.platt_c) == (0.25, 1.5, -0.1)
    assert loaded.metadata["default_threshold"] == 0.5


def test_same_model_same_bytes(tmp_path: Path) -> None:
    """Saving twice gives byte-identical files (fixed zip timestamps, sorted JSON)."""
    save(_model(), tmp_path / "a.npz")
    save(_model(), tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def _rewrite(src: Path, dst: Path, name: str, payload: bytes) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.namelist():
            zout.writestr(item, payload if item == name else zin.read(item))


def test_pickled_arrays_are_refused(tmp_path: Path) -> None:
    """An object array (which needs pickle) inside the artifact is rejected, not unpickled."""
    save(_model(), tmp_path / "ok.npz")
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    _rewrite(tmp_path / "ok.npz", tmp_path / "bad.npz", "hashed_weight.npy", buf.getvalue())
    with pytest.raises(ArtifactError):
        load(tmp_path / "bad.npz")


def test_foreign_feature_spec_is_refused(tmp_path: Path) -> None:
    """An artifact trained with other features cannot be loaded by this scorer."""
    save(_model(), tmp_path / "ok.npz")
    with zipfile.ZipFile(tmp_path / "ok.npz") as zf:
        meta = json.loads(zf.read("metadata.json"))
    meta["feature_spec"] = {**meta["feature_spec"], "hash_bits": 20}
    _rewrite(tmp_path / "ok.npz", tmp_path / "bad.npz", "metadata.json", json.dumps(meta).encode())
    with pytest.raises(ArtifactError, match="feature set"):
        load(tmp_path / "bad.npz")


def test_extra_members_and_non_zip_are_refused(tmp_path: Path) -> None:
    """Unexpected zip members, garbage files and bad indices all raise ArtifactError."""
    save(_model(), tmp_path / "ok.npz")
    with zipfile.ZipFile(tmp_path / "ok.npz", "a") as zf:
        zf.writestr("payload.pkl", b"\x80\x04.")
    with pytest.raises(ArtifactError, match="members"):
        load(tmp_path / "ok.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ArtifactError):
        load(tmp_path / "junk.npz")
    bad = _model()
    bad.hashed_index[0] = HASH_SIZE
    save(bad, tmp_path / "range.npz")
    with pytest.raises(ArtifactError, match="range"):
        load(tmp_path / "range.npz")


def test_shipped_artifact_is_small_and_loads() -> None:
    """The default artifact stays under 5 MB and loads with its metadata."""
    assert router_models.DEFAULT_ARTIFACT.stat().st_size < 5 * 1024 * 1024
    model = load(router_models.DEFAULT_ARTIFACT)
    assert model.metadata["feature_spec"] == FEATURE_SPEC
    assert model.hashed_index.size > 1000
