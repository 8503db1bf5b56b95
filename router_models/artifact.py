"""The router artifact: a small, pickle-free zip of ``.npy`` arrays plus JSON metadata.

Members (written with fixed timestamps so the same model gives the same bytes):

* ``metadata.json`` — format, version, data digest, feature spec, calibration, default
  threshold, reference score quantiles, training settings;
* ``hashed_index.npy`` (int32) and ``hashed_weight.npy`` (float64) — the non-zero weights of
  the hashed n-gram block;
* ``structural_weight.npy`` (float64) — one weight per structural feature.

Arrays are read with ``allow_pickle=False``; the metadata is plain JSON.  Nothing on disk can
run code when loaded.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from router_models.features import FEATURE_SPEC, HASH_SIZE, STRUCTURAL_NAMES

ARTIFACT_FORMAT: Final = "tiergate-router"
ARTIFACT_VERSION: Final = 1
DEFAULT_ARTIFACT: Final = Path(__file__).parent / "artifacts" / "default.npz"
_FIXED_TIME: Final = (1980, 1, 1, 0, 0, 0)
_MEMBERS: Final = (
    "metadata.json",
    "hashed_index.npy",
    "hashed_weight.npy",
    "structural_weight.npy",
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int32]


class ArtifactError(ValueError):
    """The file is not a router artifact this code can load."""


@dataclass(frozen=True)
class RouterModel:
    """A calibrated linear model: ``p = sigmoid(a * (w·x + b) + c)``."""

    hashed_index: IntArray
    hashed_weight: FloatArray
    structural_weight: FloatArray
    intercept: float
    platt_a: float
    platt_c: float
    metadata: Mapping[str, Any]

    def folded_weights(self) -> tuple[FloatArray, float]:
        """Dense weight vector and bias with the calibration folded in."""
        dense = np.zeros(HASH_SIZE + len(STRUCTURAL_NAMES), dtype=np.float64)
        dense[self.hashed_index] = self.platt_a * self.hashed_weight
        dense[HASH_SIZE:] = self.platt_a * self.structural_weight
        return dense, self.platt_a * self.intercept + self.platt_c


def _npy_bytes(array: npt.NDArray[Any]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def save(model: RouterModel, path: Path) -> None:
    """Write ``model`` to ``path`` deterministically (same model, same bytes)."""
    meta = dict(model.metadata)
    meta.update(
        format=ARTIFACT_FORMAT,
        version=ARTIFACT_VERSION,
        intercept=model.intercept,
        platt={"a": model.platt_a, "c": model.platt_c},
    )
    payload = {
        "metadata.json": json.dumps(meta, indent=1, sort_keys=True).encode(),
        "hashed_index.npy": _npy_bytes(model.hashed_index.astype(np.int32)),
        "hashed_weight.npy": _npy_bytes(model.hashed_weight.astype(np.float64)),
        "structural_weight.npy": _npy_bytes(model.structural_weight.astype(np.float64)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name in _MEMBERS:
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, payload[name])


def _read_array(zf: zipfile.ZipFile, name: str) -> npt.NDArray[Any]:
    with zf.open(name) as fh:
        return np.lib.format.read_array(io.BytesIO(fh.read()), allow_pickle=False)


def _check(
    meta: Mapping[str, Any], index: IntArray, weight: FloatArray, struct: FloatArray
) -> None:
    if meta.get("format") != ARTIFACT_FORMAT or meta.get("version") != ARTIFACT_VERSION:
        raise ArtifactError("not a tiergate-router artifact of a supported version")
    if meta.get("feature_spec") != FEATURE_SPEC:
        raise ArtifactError("artifact was trained with a different feature set")
    if index.dtype != np.int32 or weight.dtype != np.float64 or struct.dtype != np.float64:
        raise ArtifactError("unexpected array types in artifact")
    if index.shape != weight.shape or struct.shape != (len(STRUCTURAL_NAMES),):
        raise ArtifactError("unexpected array shapes in artifact")
    if index.size and (int(index.min()) < 0 or int(index.max()) >= HASH_SIZE):
        raise ArtifactError("hashed index out of range")


def load(path: Path) -> RouterModel:
    """Read an artifact written by ``save``; raises ``ArtifactError`` on anything else."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = sorted(zf.namelist())
            meta = json.loads(zf.read("metadata.json"))
            index = _read_array(zf, "hashed_index.npy")
            weight = _read_array(zf, "hashed_weight.npy")
            struct = _read_array(zf, "structural_weight.npy")
    except (zipfile.BadZipFile, ValueError, KeyError) as exc:
        # ValueError covers bad JSON and arrays that would need pickle to load.
        raise ArtifactError(f"cannot read router artifact {path}: {exc}") from exc
    if members != sorted(_MEMBERS):
        raise ArtifactError("unexpected members in artifact")
    if not isinstance(meta, dict):
        raise ArtifactError("artifact metadata is not an object")
    _check(meta, index, weight, struct)
    try:
        intercept = float(meta["intercept"])
        platt_a, platt_c = float(meta["platt"]["a"]), float(meta["platt"]["c"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"artifact metadata lacks calibration: {exc}") from exc
    return RouterModel(
        hashed_index=index,
        hashed_weight=weight,
        structural_weight=struct,
        intercept=intercept,
        platt_a=platt_a,
        platt_c=platt_c,
        metadata=meta,
    )
