"""Tenant balance for ``tiergate router train --from-shadow``: no tenant's prompts outweigh
the rest.

Shadow records carry the caller's tenant (``gateway/routing/shadow_store.py``). Sampling is
per request, so a tenant sending most of the traffic would supply most of the rows, and the
router every tenant gets would learn mostly its prompts. :func:`tenant_weights` scales down
the rows of the tenants above a share of the total (water-filling: each such tenant is brought
to one common level, the others keep weight 1, nobody is weighted up), so that the largest
tenant carries at most ``max_share`` of the shadow weight. With fewer than ``1 / max_share``
tenants that cannot hold and the share used is ``1 / tenants``: every tenant above the level
weighs as much as the others together allow, two tenants weigh equally. Records written before
tenants were recorded are one tenant, ``UNKNOWN`` (``""``; a real tenant name is never empty).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from router_models.artifact import FloatArray

UNKNOWN: Final = ""  # the tenant of a record written before records named one
DEFAULT_MAX_SHARE: Final = 0.5  # no tenant outweighs all the others together


def level(counts: Sequence[int], max_share: float) -> float | None:
    """The row count each tenant above the cap is brought down to, or None (no cap binds).

    ``counts`` are rows per tenant. The share used is ``max(max_share, 1 / len(counts))``.
    """
    if not 0 < max_share <= 1:  # also refuses NaN
        raise ValueError(f"max_share must be in (0, 1], not {max_share!r}")
    n = sorted(counts, reverse=True)
    if len(n) < 2 or max_share >= 1:  # one tenant: nothing to balance
        return None
    share = max(max_share, 1 / len(n))
    if n[0] <= share * sum(n):
        return None
    for capped in range(1, len(n)):
        rest = sum(n[capped:])
        room = 1 - share * capped
        if room <= 0:
            break
        cap = share * rest / room
        if n[capped] <= cap * (1 + 1e-12) and cap <= n[capped - 1] * (1 + 1e-12):
            return cap
    return float(n[-1])  # every tenant at the smallest one's count (share 1 / tenants)


def tenant_weights(tenants: Sequence[str], max_share: float = DEFAULT_MAX_SHARE) -> FloatArray:
    """Each row's weight multiplier in (0, 1]: 1, or ``level / rows of its tenant``."""
    counts = Counter(tenants)
    cap = level(list(counts.values()), max_share)
    if cap is None:
        return np.ones(len(tenants), dtype=np.float64)
    return np.asarray([min(1.0, cap / counts[t]) for t in tenants], dtype=np.float64)


def summary(tenants: Sequence[str], weights: FloatArray) -> dict[str, Any]:
    """How the rows split among tenants, by count and by weight (no tenant names)."""
    counts = Counter(tenants)
    if not tenants:
        return {"tenants": 0}
    by_weight: dict[str, float] = {}
    for tenant, weight in zip(tenants, weights.tolist(), strict=True):
        by_weight[tenant] = by_weight.get(tenant, 0.0) + weight
    total = sum(by_weight.values())
    return {
        "tenants": len(counts),
        "unknown_tenant_rows": counts.get(UNKNOWN, 0),
        "largest_row_share": round(max(counts.values()) / len(tenants), 4),
        "largest_weight_share": round(max(by_weight.values()) / total, 4) if total else 0.0,
    }
