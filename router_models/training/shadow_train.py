"""Learning from shadow records: the router retrained on a deployment's own traffic, no text.

A shadow record (``gateway/routing/shadow.py``) holds the router's hashed feature vector of a
request
and how well the two tiers' answers agreed. That is a label:

* a fast-routed request whose precise shadow *disagreed* should have gone precise (complex);
* a precise-routed request whose fast shadow *agreed* could have gone fast (simple);
* and likewise the other two cases (agreement confirms fast, disagreement confirms precise).

So every record gives ``complex`` when its agreement is below ``agree_at`` and ``simple``
otherwise; records of one prompt (same ``prompt_digest``) from one tenant are merged, their
agreement averaged (one tenant's many records of a prompt never outvote another's view of it).
Records of another feature space (written before the feature code changed) are stale and
skipped. With ``label="judge"`` (``--shadow-label judge``) the precise tier's rubric score of
the fast answer (``router.shadow.judge_ratio``, recorded as ``judge``) labels the prompt
instead, and prompts never judged are left out. The prompts are split by a hash of their
digest: a held-out share is never trained on and is where ``shadow_eval`` compares the old and
new artifacts.

Training blends these rows, weighted ``shadow_weight`` times the tenant balance
(``tenant_balance.py``: no tenant's rows carry more than ``max_tenant_share`` of the weight),
with the shipped corpus (featurised
from its text as ``train.train`` does): out-of-fold margins over ``folds`` (3) hash folds give the
Platt calibration and the reference quantiles, then one fit on everything gives the weights.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from scipy import sparse

from policies.threshold import threshold_for_share
from router_models.artifact import FloatArray, RouterModel
from router_models.features import FEATURE_SPEC, HASH_SIZE, n_features
from router_models.records import RecordError, data_digest
from router_models.training.crossval import held_out_margins, platt, sigmoid
from router_models.training.tenant_balance import (
    DEFAULT_MAX_SHARE,
    UNKNOWN,
    summary,
    tenant_weights,
)
from router_models.training.train import (
    DEFAULT_DATA,
    MODEL_VERSION,
    QUANTILE_POINTS,
    REFERENCE_COMPLEX_SHARE,
    Prepared,
    TrainSettings,
    load_training,
    prepare,
    reference_sample,
)
from router_models.vectors import HashedVector, feature_space

BoolArray = npt.NDArray[np.bool_]
SPLIT_SALT: Final = "tiergate-shadow-split:"
LABELS: Final = ("agreement", "judge")  # what labels a shadow prompt (``read_shadow``)
JUDGE_AT: Final = 0.625  # a mean rubric score below this (3 of 5 or lower) labels it complex


@dataclass(frozen=True, slots=True)
class ShadowSettings:
    """How shadow records become training rows."""

    agree_at: float = 0.5  # agreement below this labels a prompt complex
    label: str = "agreement"  # or "judge": the rubric score labels it (``read_shadow``)
    judge_at: float = JUDGE_AT  # with label "judge": a mean score below this is complex
    # Weight of one shadow prompt against one corpus row. More learns the local traffic faster
    # and can forget the rest faster. 1.0 since issue 35 (bench/results/shadow-noise.md): on a
    # 13-source traffic mix with 10-30 % of agreement labels flipped, held-out AUC at 1,000
    # shadows averaged 0.839 at 1.0, 0.835 at 0.3, 0.825 at 0.1 (seed spread <= 0.006), and
    # AUC on never-learned rows stayed within 0.011 of the shipped artifact's. With v4 features
    # and four single-label sources, 1.0 had cost 0.31 AUC elsewhere (docs/savings.md).
    shadow_weight: float = 1.0
    # No tenant's rows carry more than this share of the shadow weight (1.0: off); records
    # without a tenant are one tenant, unknown (tenant_balance.py).
    max_tenant_share: float = DEFAULT_MAX_SHARE
    held_out_share: float = 0.2  # prompts (by digest hash) kept for the comparison
    folds: int = 3  # out-of-fold margins for the calibration: one fit per fold
    base: TrainSettings = field(default_factory=TrainSettings)


@dataclass(frozen=True, slots=True)
class ShadowSet:
    """Shadow prompts as rows: one vector, mean agreement and label per tenant and prompt
    digest (``tenants[i]`` is row i's tenant, ``UNKNOWN`` for records that name none)."""

    digests: list[str]
    vectors: list[HashedVector]
    agreement: FloatArray
    y: FloatArray
    records: int
    stale: int
    tenants: list[str]

    def subset(self, mask: BoolArray) -> ShadowSet:
        """The rows where ``mask`` is true (record counts kept)."""
        rows = np.flatnonzero(mask)
        return ShadowSet(
            [self.digests[i] for i in rows],
            [self.vectors[i] for i in rows],
            self.agreement[rows],
            self.y[rows],
            self.records,
            self.stale,
            [self.tenants[i] for i in rows],
        )


def store_files(store: Path) -> list[Path]:
    """A shadow store's files, oldest first: ``STORE.1`` (rotated half) then ``STORE``."""
    files = [p for p in (store.with_name(store.name + ".1"), store) if p.exists()]
    if not files:
        raise FileNotFoundError(f"no shadow store at {store}")
    return files


def _records(paths: Iterable[Path]) -> Iterable[tuple[str, dict[str, Any]]]:
    """Each record object with where it is (``path:line``)."""
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{path}:{number}: invalid JSON: {exc}") from exc
                if isinstance(record, dict):
                    yield f"{path}:{number}", record


def _judge(where: str, value: object) -> float | None:
    """A record's ``judge`` score: None when it was not judged; the gateway writes ``(n - 1) /
    4`` of a 1-5 verdict, so anything but a finite number in [0, 1] is a corrupt record (a
    NaN would make its prompt's mean NaN, and a string or a boolean is not a score)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise RecordError(f"{where}: judge must be a number from 0 to 1 or null, not {value!r}")
    return float(value)


def _agreement(where: str, value: object) -> float:
    """A record's ``agreement``: the gateway writes a number in [0, 1]; anything else (NaN,
    1e300, a bool, a string, none) is a corrupt record, not a label."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise RecordError(f"{where}: agreement must be a number from 0 to 1, not {value!r:.40}")
    return float(value)


def _digest(where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{where}: prompt_digest must be a non-empty string")
    return value


def _vector(where: str, space: str, feats: dict[str, Any]) -> HashedVector:
    """A record's feature vector: in-range integer indices and finite values, as many."""
    index, value = feats.get("index"), feats.get("value")
    width = n_features()
    if (
        not isinstance(index, list)
        or not isinstance(value, list)
        or len(index) != len(value)
        or not all(type(i) is int and 0 <= i < width for i in index)
        or not all(type(v) in {int, float} and math.isfinite(v) for v in value)
    ):
        raise RecordError(
            f"{where}: features must be index (integers from 0 to {width - 1}) and value "
            "(finite numbers) lists of one length"
        )
    return HashedVector(space, tuple(index), tuple(float(v) for v in value))


def _tenant(where: str, value: object) -> str:
    """A record's tenant: ``UNKNOWN`` when it names none (written before tenants were)."""
    if value is None:
        return UNKNOWN
    if not isinstance(value, str):
        raise RecordError(f"{where}: tenant must be a string or null, not {value!r}")
    return value


def read_shadow(
    paths: Sequence[Path],
    agree_at: float = 0.5,
    *,
    label: str = "agreement",
    judge_at: float = JUDGE_AT,
) -> ShadowSet:
    """Shadow records merged by tenant and prompt digest; another feature space is skipped.

    ``label="agreement"``: a prompt is complex when its mean agreement is below ``agree_at``.
    ``label="judge"``: when the mean of its records' non-null ``judge`` scores (the precise
    tier's rubric score of the fast answer, ``(n - 1) / 4``) is below ``judge_at``; the default
    0.625 makes rubric score 3 or lower (the fast answer lost quality) complex. Prompts with no
    judged record are left out.
    """
    if label not in LABELS:
        raise ValueError(f"label must be one of {LABELS}, not {label!r}")
    if not 0 < judge_at <= 1:  # also refuses NaN
        raise ValueError(f"judge_at must be in (0, 1], not {judge_at!r}")
    space = feature_space()
    merged: dict[tuple[str, str], tuple[HashedVector, list[float], list[float]]] = {}
    records = stale = 0
    for where, record in _records(paths):
        records += 1
        feats = record.get("features")
        if record.get("feature_space") != space or not isinstance(feats, dict):
            stale += 1
            continue
        vector = _vector(where, space, feats)
        key = (_digest(where, record.get("prompt_digest")), _tenant(where, record.get("tenant")))
        entry = merged.setdefault(key, (vector, [], []))
        entry[1].append(_agreement(where, record.get("agreement")))
        judge = _judge(where, record.get("judge"))
        if judge is not None:
            entry[2].append(judge)
    keys = sorted(k for k in merged if label == "agreement" or merged[k][2])
    agreement = np.asarray([np.mean(merged[k][1]) for k in keys], dtype=np.float64)
    if label == "agreement":
        y = agreement < agree_at
    else:
        y = np.asarray([np.mean(merged[k][2]) < judge_at for k in keys], dtype=np.bool_)
    return ShadowSet(
        [digest for digest, _ in keys],
        [merged[k][0] for k in keys],
        agreement,
        y.astype(np.float64),
        records,
        stale,
        [tenant for _, tenant in keys],
    )


def hash_unit(key: str, salt: str = SPLIT_SALT) -> float:
    """A deterministic number in [0, 1) for ``key`` (the held-out split and the folds)."""
    data = hashlib.blake2b((salt + key).encode(), digest_size=8).digest()
    return int.from_bytes(data, "big") / 2.0**64


def held_out_mask(digests: Sequence[str], share: float) -> BoolArray:
    """Which prompts are held out: those whose digest hashes below ``share``."""
    return np.asarray([hash_unit(d) < share for d in digests], dtype=np.bool_)


def to_csr(vectors: Sequence[HashedVector]) -> sparse.csr_matrix:
    """One CSR row per vector; ``ValueError`` for a vector of another feature space."""
    space, width = feature_space(), n_features()
    indptr = [0]
    indices: list[int] = []
    values: list[float] = []
    for vector in vectors:
        if vector.space != space:
            raise ValueError(f"vector of feature space {vector.space!r}, not {space!r}")
        if len(vector.index) != len(vector.value):
            raise ValueError("vector index and value lengths differ")
        if vector.index and (min(vector.index) < 0 or max(vector.index) >= width):
            raise ValueError("vector index out of range")
        indices.extend(vector.index)
        values.extend(vector.value)
        indptr.append(len(indices))
    return sparse.csr_matrix(
        (np.asarray(values, dtype=np.float64), np.asarray(indices, dtype=np.int32), indptr),
        shape=(len(vectors), width),
    )


def scores(model: RouterModel, x: sparse.csr_matrix) -> FloatArray:
    """Each row's calibrated probability of needing precise (the lean scorer's number)."""
    dense, bias = model.folded_weights()
    return sigmoid(np.asarray(x @ dense + bias, dtype=np.float64))


@dataclass(frozen=True, slots=True)
class Blend:
    """Corpus rows then shadow rows, with weights and hash folds."""

    x: sparse.csr_matrix
    y: FloatArray
    weight: FloatArray
    folds: list[str]
    n_corpus: int
    corpus_digest: str  # of the corpus files' bytes, as the artifact's metadata records it


@functools.lru_cache(maxsize=1)
def _prepared_corpus(corpus: tuple[Path, ...], digest: str, settings: TrainSettings) -> Prepared:
    """The corpus featurised from its text, kept for this process's next retraining on the
    same files (featurising its ~9,000 prompts costs about as much as a fit: a bench that
    retrains at several steps, or a test that retrains twice, pays it once). ``digest`` (of
    the files' bytes) is part of the key, so a file changed in between is read again. Read
    only: ``blend`` copies what it uses into the blend."""
    del digest  # the cache key only
    return prepare(load_training(corpus), settings)


def blend(corpus: Sequence[Path], shadow: ShadowSet, settings: ShadowSettings) -> Blend:
    """The training matrix: the corpus featurised from text, the shadow rows from vectors
    (weight ``shadow_weight`` times the tenant balance)."""
    digest = data_digest(corpus)
    data = _prepared_corpus(tuple(corpus), digest, settings.base)
    balance = tenant_weights(shadow.tenants, settings.max_tenant_share)
    keys = [str(r.get("id", i)) for i, r in enumerate(data.records)] + shadow.digests
    folds = [f"fold{int(hash_unit(k, 'fold:') * settings.folds)}" for k in keys]
    return Blend(
        sparse.vstack([data.x, to_csr(shadow.vectors)], format="csr"),
        np.concatenate([data.y, shadow.y]),
        np.concatenate([data.weight, settings.shadow_weight * balance]),
        folds,
        int(data.y.size),
        digest,
    )


def _metadata(
    corpus: Sequence[Path],
    data: Blend,
    reference: FloatArray,
    shadow: dict[str, Any],
    share: float,
) -> dict[str, Any]:
    return {
        "model_version": MODEL_VERSION,
        "data_files": [p.name for p in corpus],
        "data_digest": data.corpus_digest,
        "n_examples": int(data.y.size),
        "n_complex": int(data.y.sum()),
        "feature_spec": FEATURE_SPEC,
        "default_target_share": share,
        "default_threshold": threshold_for_share(reference.tolist(), share),
        "reference": {
            "sample": "calibrated out-of-fold scores of corpus and shadow rows, stratified",
            "complex_share": REFERENCE_COMPLEX_SHARE,
            "size": int(reference.size),
            "quantiles": np.quantile(reference, np.linspace(0, 1, QUANTILE_POINTS)).tolist(),
        },
        "shadow": shadow,
    }


def train_from_shadow(
    corpus: Sequence[Path],
    shadow: ShadowSet,
    settings: ShadowSettings,
    provenance: dict[str, Any],
) -> RouterModel:
    """A calibrated artifact fitted on the corpus plus ``shadow`` (the training prompts)."""
    data = blend(corpus, shadow, settings)
    if np.unique(data.y).size < 2:
        raise ValueError("training data needs both simple and complex examples")
    fit = settings.base.fitter()
    used = data.weight > 0
    names = sorted(set(data.folds))
    oof = held_out_margins(data.x, data.y, data.weight, data.folds, used, fit, names)
    a, c = platt(oof[used], data.y[used], data.weight[used])
    final = fit(data.x[used], data.y[used], data.weight[used])
    hashed = final.coef[:HASH_SIZE]
    nonzero = np.flatnonzero(hashed).astype(np.int32)
    reference = reference_sample(sigmoid(a * oof[used] + c), data.y[used], REFERENCE_COMPLEX_SHARE)
    about = {
        **provenance,
        "prompts": len(shadow.digests),
        "complex": int(shadow.y.sum()),
        "agree_at": settings.agree_at,
        **({"label": "judge", "judge_at": settings.judge_at} if settings.label == "judge" else {}),
        "shadow_weight": settings.shadow_weight,
        "max_tenant_share": settings.max_tenant_share,
        **summary(shadow.tenants, tenant_weights(shadow.tenants, settings.max_tenant_share)),
        "folds": settings.folds,
    }
    return RouterModel(
        hashed_index=nonzero,
        hashed_weight=hashed[nonzero].astype(np.float64),
        structural_weight=final.coef[HASH_SIZE:].astype(np.float64),
        intercept=final.intercept,
        platt_a=a,
        platt_c=c,
        metadata=_metadata(corpus, data, reference, about, settings.base.target_share),
    )


__all__ = ["DEFAULT_DATA", "ShadowSet", "ShadowSettings", "read_shadow", "train_from_shadow"]
