"""``tiergate router train --from-shadow STORE``: retrain, compare old and new, write.

1. Read the store's records (``shadow_train.read_shadow``; stale feature spaces skipped).
2. Hold out a share of the prompts by digest hash; train on the corpus plus the rest, each
   tenant's rows weighing at most ``max_tenant_share`` of the shadow weight.
3. Score the held-out prompts with the base (live) artifact and the new one, from their
   feature vectors, and compare: simple prompts sent to precise at equal complex caught, and
   quality retained by precise share, each held-out row carrying its tenant's training
   weight (a flooding tenant's held-out rows count no more than its training rows did).
4. Write the new artifact (the pickle-free format the gateway loads) and return the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from router_models import artifact_digest
from router_models.artifact import RouterModel, load, save
from router_models.training.shadow_eval import compare, quality_curve
from router_models.training.shadow_train import (
    ShadowSet,
    ShadowSettings,
    held_out_mask,
    read_shadow,
    scores,
    store_files,
    to_csr,
    train_from_shadow,
)
from router_models.training.tenant_balance import DEFAULT_MAX_SHARE, summary, tenant_weights


def compare_on(
    old: RouterModel,
    new: RouterModel,
    held: ShadowSet,
    max_tenant_share: float = DEFAULT_MAX_SHARE,
) -> dict[str, Any]:
    """Old against new on held-out shadow prompts (labels and agreement from the shadows),
    each tenant's rows weighted as training weighs them (at most ``max_tenant_share``)."""
    x = to_csr(held.vectors)
    old_scores, new_scores = scores(old, x), scores(new, x)
    weights = tenant_weights(held.tenants, max_tenant_share)
    threshold = float(old.metadata["default_threshold"])
    report = compare(old_scores, new_scores, held.y, threshold, weights)
    report["tenant_balance"] = {
        "max_tenant_share": max_tenant_share,
        **summary(held.tenants, weights),
    }
    report["quality_old"] = quality_curve(old_scores, held.agreement, weights=weights)
    report["quality_new"] = quality_curve(new_scores, held.agreement, weights=weights)
    return report


def retrain(
    store: Path,
    out: Path,
    base: Path,
    corpus: Sequence[Path],
    settings: ShadowSettings | None = None,
) -> dict[str, Any]:
    """Train from ``store`` and the corpus, compare with ``base``, write ``out``; the report."""
    settings = settings or ShadowSettings()
    files = store_files(store)
    shadow = read_shadow(files, settings.agree_at, label=settings.label, judge_at=settings.judge_at)
    if not shadow.digests:
        if settings.label == "judge" and shadow.records > shadow.stale:
            raise ValueError(
                f"{store}: no judged shadow record (judge labels need "
                "router.shadow.judge_ratio > 0; or use --shadow-label agreement)"
            )
        raise ValueError(f"{store}: no shadow records of the current feature space")
    held = held_out_mask(shadow.digests, settings.held_out_share)
    train_set, held_set = shadow.subset(~held), shadow.subset(held)
    old = load(base)
    provenance = {
        "records": shadow.records,
        "stale_records": shadow.stale,
        "held_out_prompts": len(held_set.digests),
        "base_artifact": artifact_digest(base),
    }
    new = train_from_shadow(corpus, train_set, settings, provenance)
    report: dict[str, Any] = {
        "store": [str(p) for p in files],
        "records": shadow.records,
        "stale_records": shadow.stale,
        "prompts": len(shadow.digests),
        "train_prompts": len(train_set.digests),
        "base_artifact": provenance["base_artifact"],
        "tenant_balance": {
            "max_tenant_share": settings.max_tenant_share,
            **summary(
                train_set.tenants, tenant_weights(train_set.tenants, settings.max_tenant_share)
            ),
        },
    }
    if np.unique(held_set.y).size == 2:
        report["comparison"] = compare_on(old, new, held_set, settings.max_tenant_share)
    save(new, out)
    report["artifact"] = {"path": str(out), "id": artifact_digest(out)}
    return report
