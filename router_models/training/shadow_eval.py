"""Old artifact against new on held-out labelled rows: what retraining buys, in two views.

* **At equal complex caught** (the issue's target): for a share of the complex rows caught,
  the smallest threshold each artifact needs to catch it, and the share of simple rows it
  then sends to precise. The headline point is the old artifact's own operating point (its
  default threshold); ``reduction`` is how much less simple traffic the new one sends there.
* **Quality retained vs precise share** (shadow rows only, which carry agreement): at each
  precise share, the mean over rows of 1 where the row goes precise and its agreement where
  it goes fast.

Scores come from feature vectors alone (``shadow_train.scores``), so no prompt text is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from policies.threshold import threshold_for_share
from router_models.artifact import FloatArray

CAUGHT_LEVELS: Final = (0.8, 0.9, 0.95)
PRECISE_SHARES: Final = (0.1, 0.2, 0.3, 0.4, 0.5)


def threshold_catching(scores: FloatArray, y: FloatArray, caught: float) -> float:
    """The highest threshold at which at least ``caught`` of the complex rows score above."""
    complex_ = np.sort(scores[y == 1])[::-1]
    if complex_.size == 0:
        raise ValueError("no complex rows to catch")
    need = max(1, math.ceil(caught * complex_.size - 1e-9))
    return float(complex_[need - 1])


def sent_and_caught(scores: FloatArray, y: FloatArray, threshold: float) -> tuple[float, float]:
    """(share of simple rows sent to precise, share of complex rows caught) at ``threshold``."""
    sent = scores >= threshold
    simple = y == 0
    return float(sent[simple].mean()), float(sent[~simple].mean())


def at_equal_caught(
    old: FloatArray, new: FloatArray, y: FloatArray, caught: float
) -> dict[str, Any]:
    """Simple rows each artifact sends to precise when both catch ``caught`` of the complex."""
    old_sent, old_caught = sent_and_caught(old, y, threshold_catching(old, y, caught))
    new_sent, new_caught = sent_and_caught(new, y, threshold_catching(new, y, caught))
    return {
        "caught_target": round(caught, 4),
        "old": {"simple_sent": round(old_sent, 4), "complex_caught": round(old_caught, 4)},
        "new": {"simple_sent": round(new_sent, 4), "complex_caught": round(new_caught, 4)},
        "reduction": round(1.0 - new_sent / old_sent, 4) if old_sent > 0 else None,
    }


def quality_curve(
    scores: FloatArray, agreement: FloatArray, shares: Sequence[float] = PRECISE_SHARES
) -> list[dict[str, float]]:
    """Quality retained (agreement, 1 for precise-routed rows) at each precise share."""
    out = []
    for share in shares:
        threshold = threshold_for_share(scores.tolist(), share)
        kept = np.where(scores >= threshold, 1.0, agreement)
        out.append({"precise_share": share, "quality_retained": round(float(kept.mean()), 4)})
    return out


def compare(
    old: FloatArray, new: FloatArray, y: FloatArray, old_threshold: float
) -> dict[str, Any]:
    """Both views at the old artifact's operating point and at ``CAUGHT_LEVELS``."""
    if np.unique(y).size < 2:
        raise ValueError("the comparison needs both simple and complex held-out rows")
    _, operating = sent_and_caught(old, y, old_threshold)
    return {
        "rows": int(y.size),
        "complex": int(y.sum()),
        "old_threshold": round(old_threshold, 6),
        "operating_point": at_equal_caught(old, new, y, operating),
        "curve": [at_equal_caught(old, new, y, level) for level in CAUGHT_LEVELS],
    }


def render(comparison: dict[str, Any]) -> str:
    """The comparison as a few lines of text."""
    lines = [
        f"held out: {comparison['rows']} rows ({comparison['complex']} complex); "
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
            + (f" ({reduction:.1%} fewer)" if reduction is not None else "")
        )
    for view in ("quality_old", "quality_new"):
        if view in comparison:
            cells = ", ".join(
                f"{q['precise_share']:.1f}: {q['quality_retained']:.3f}" for q in comparison[view]
            )
            lines.append(f"  {view.replace('_', ' ')} by precise share: {cells}")
    return "\n".join(lines)
