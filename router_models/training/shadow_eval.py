"""Old artifact against new on held-out labelled rows: what retraining buys, in two views.

* **At equal complex caught** (the issue's target): for a share of the complex rows caught,
  the smallest threshold each artifact needs to catch it, and the share of simple rows it
  then sends to precise. The headline point is the old artifact's own operating point (its
  default threshold); ``reduction`` is how much less simple traffic the new one sends there.
* **Quality retained vs precise share** (shadow rows only, which carry agreement): at each
  precise share, the mean over rows of 1 where the row goes precise and its agreement where
  it goes fast.

Every share may be weighted per row (``weights``): ``retrain.compare_on`` passes the tenant
weights training used (``tenant_balance.tenant_weights``), so a tenant flooding the held-out
rows counts no more in the comparison than it did in training. Each function scales the
weights by their largest one first, so rows all of one weight give exactly the unweighted
result (the weights are then all 1.0 and every weighted sum is a count).

Scores come from feature vectors alone (``shadow_train.scores``), so no prompt text is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from router_models.artifact import FloatArray

CAUGHT_LEVELS: Final = (0.8, 0.9, 0.95)
PRECISE_SHARES: Final = (0.1, 0.2, 0.3, 0.4, 0.5)


def _unit_weights(n: int, weights: FloatArray | None) -> FloatArray:
    """``weights`` over their largest (all 1.0 when they are equal); ones when None."""
    if weights is None:
        return np.ones(n, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"need one weight per row: {w.shape} for {n} rows")
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError("row weights must be finite and positive")
    top = float(w.max()) if n else 1.0
    return w / top


def _ranked_for_share(ranked: FloatArray, weights: FloatArray, share: float) -> float:
    """The highest of the scores ``ranked`` (descending; ``weights`` in the same order) at or
    above which at least ``share`` of the weight lies; above the highest when ``share`` is 0.

    With unit weights this is the k-th highest score, ``k = ceil(share * n)``: the same
    threshold as ``policies.threshold.threshold_for_share``."""
    total = float(weights.sum())
    need = share * total - 1e-9
    if need <= 0:
        return math.nextafter(float(ranked[0]), math.inf)
    reached = np.flatnonzero(np.cumsum(weights) >= need)
    return float(ranked[reached[0]] if reached.size else ranked[-1])


def threshold_for_weighted_share(
    scores: FloatArray, share: float, weights: FloatArray | None = None
) -> float:
    """Threshold sending ``share`` of the row weight to precise (``score >= t``): the weighted
    ``threshold_for_share`` (equal weights: the same threshold). Ties at the threshold all go
    precise, so the realised share can exceed ``share``."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], not {share!r}")
    if scores.size == 0:
        raise ValueError("need at least one reference score")
    if np.any(np.isnan(scores)):
        raise ValueError("reference scores contain NaN")
    w = _unit_weights(scores.size, weights)
    order = np.argsort(-scores, kind="stable")
    return _ranked_for_share(scores[order], w[order], share)


def threshold_catching(
    scores: FloatArray, y: FloatArray, caught: float, weights: FloatArray | None = None
) -> float:
    """The highest threshold at which at least ``caught`` of the complex rows (of their weight,
    with ``weights``) score above."""
    complex_ = y == 1
    if not complex_.any():
        raise ValueError("no complex rows to catch")
    w = _unit_weights(y.size, weights)[complex_]
    order = np.argsort(-scores[complex_], kind="stable")
    ranked = scores[complex_][order]
    if caught * float(w.sum()) - 1e-9 <= 0:  # at least one complex row, as unweighted
        return float(ranked[0])
    return _ranked_for_share(ranked, w[order], caught)


def sent_and_caught(
    scores: FloatArray, y: FloatArray, threshold: float, weights: FloatArray | None = None
) -> tuple[float, float]:
    """(share of simple rows sent to precise, share of complex rows caught) at ``threshold``;
    shares of the row weight with ``weights``."""
    w = _unit_weights(y.size, weights)
    sent = scores >= threshold
    simple = y == 0
    return (
        float(w[sent & simple].sum() / w[simple].sum()),
        float(w[sent & ~simple].sum() / w[~simple].sum()),
    )


def at_equal_caught(
    old: FloatArray,
    new: FloatArray,
    y: FloatArray,
    caught: float,
    weights: FloatArray | None = None,
) -> dict[str, Any]:
    """Simple rows each artifact sends to precise when both catch ``caught`` of the complex."""
    old_sent, old_caught = sent_and_caught(
        old, y, threshold_catching(old, y, caught, weights), weights
    )
    new_sent, new_caught = sent_and_caught(
        new, y, threshold_catching(new, y, caught, weights), weights
    )
    return {
        "caught_target": round(caught, 4),
        "old": {"simple_sent": round(old_sent, 4), "complex_caught": round(old_caught, 4)},
        "new": {"simple_sent": round(new_sent, 4), "complex_caught": round(new_caught, 4)},
        "reduction": round(1.0 - new_sent / old_sent, 4) if old_sent > 0 else None,
    }


def quality_curve(
    scores: FloatArray,
    agreement: FloatArray,
    shares: Sequence[float] = PRECISE_SHARES,
    weights: FloatArray | None = None,
) -> list[dict[str, float]]:
    """Quality retained (agreement, 1 for precise-routed rows) at each precise share; the
    share and the mean of the row weight with ``weights``."""
    w = _unit_weights(scores.size, weights)
    out = []
    for share in shares:
        threshold = threshold_for_weighted_share(scores, share, w)
        kept = np.where(scores >= threshold, 1.0, agreement)
        retained = float((kept * w).sum() / w.sum())
        out.append({"precise_share": share, "quality_retained": round(retained, 4)})
    return out


def compare(
    old: FloatArray,
    new: FloatArray,
    y: FloatArray,
    old_threshold: float,
    weights: FloatArray | None = None,
) -> dict[str, Any]:
    """Both views at the old artifact's operating point and at ``CAUGHT_LEVELS``; every share
    of the row weight with ``weights`` (``tenant_weighted``; ``rows`` and ``complex`` stay
    row counts)."""
    if np.unique(y).size < 2:
        raise ValueError("the comparison needs both simple and complex held-out rows")
    _, operating = sent_and_caught(old, y, old_threshold, weights)
    return {
        "rows": int(y.size),
        "complex": int(y.sum()),
        "tenant_weighted": weights is not None,
        "old_threshold": round(old_threshold, 6),
        "operating_point": at_equal_caught(old, new, y, operating, weights),
        "curve": [at_equal_caught(old, new, y, level, weights) for level in CAUGHT_LEVELS],
    }


def _change(reduction: float) -> str:
    """`` (x% fewer)``, or ``(x% more)`` where the new artifact sends more."""
    return f" ({reduction:.1%} fewer)" if reduction >= 0 else f" ({-reduction:.1%} more)"


def render(comparison: dict[str, Any]) -> str:
    """The comparison as a few lines of text."""
    weighted = ""
    if comparison.get("tenant_weighted"):
        weighted = "tenant-weighted as in training"
        balance = comparison.get("tenant_balance")
        if balance and balance.get("tenants"):
            weighted += (
                f" ({balance['tenants']} tenant{'s' if balance['tenants'] != 1 else ''},"
                f" largest {balance['largest_row_share']:.0%}"
                f" of rows, {balance['largest_weight_share']:.0%} of weight)"
            )
        weighted = f"; {weighted}"
    lines = [
        f"held out: {comparison['rows']} rows ({comparison['complex']} complex){weighted}; "
        "simple sent to precise, old -> new, at equal complex caught:"
    ]
    points = [("operating point", comparison["operating_point"])]
    points += [(f"caught {p['caught_target']:.2f}", p) for p in comparison["curve"]]
    for name, point in points:
        reduction = point["reduction"]
        lines.append(
            f"  {name:<16} caught {point['old']['complex_caught']:.3f} / "
            f"{point['new']['complex_caught']:.3f}: simple sent "
            f"{point['old']['simple_sent']:.3f} -> {point['new']['simple_sent']:.3f}"
            + (_change(reduction) if reduction is not None else "")
        )
    for view in ("quality_old", "quality_new"):
        if view in comparison:
            cells = ", ".join(
                f"{q['precise_share']:.1f}: {q['quality_retained']:.3f}" for q in comparison[view]
            )
            lines.append(f"  {view.replace('_', ' ')} by precise share: {cells}")
    return "\n".join(lines)
