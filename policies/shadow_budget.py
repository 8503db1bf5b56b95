"""A per-tenant budget of shadow samples, so one tenant's flood cannot fill the shadow loop.

Sampling is uniform over requests (``router.shadow.fast_ratio``/``precise_ratio``), so a
tenant sending twenty times another's traffic would supply twenty times its shadow records,
and with them most of what ``tiergate router train --from-shadow`` learns and most of the
bounded store. :class:`TenantSampleBudget` caps the samples one tenant may take in a window
of one minute; a tenant under the cap is sampled exactly as before. It is one dictionary in
the worker process, consulted only for a request the ratio has already sampled: no IO, no
lock, no Redis round trip on the request path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WINDOW_S = 60.0


def worker_share(per_minute: int | None, workers: int) -> int | None:
    """One worker's part of a gateway's per-tenant cap: the cap divided among its ``workers``
    processes, rounded down, at least 1 (so N workers above the cap take N a minute)."""
    if per_minute is None or workers <= 1:
        return per_minute
    return max(1, per_minute // workers)


class TenantSampleBudget:
    """At most ``per_minute`` shadow samples per tenant in each one-minute window (``None``:
    no cap). Per process: a gateway of N workers gives each its :func:`worker_share`.

    The windows are fixed (the first sample after one has run out starts the next) and the
    counts of the previous window are dropped when it ends, so the memory held is one entry
    per tenant sampled within the current minute.
    """

    def __init__(self, per_minute: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.started = clock()
        self.taken: dict[str, int] = {}

    def take(self, tenant: str) -> bool:
        """Count one sample for ``tenant``; False (nothing counted) when its budget is spent."""
        if self.per_minute is None:
            return True
        now = self.clock()
        if now - self.started >= WINDOW_S:
            self.taken.clear()
            self.started = now
        taken = self.taken.get(tenant, 0)
        if taken >= self.per_minute:
            return False
        self.taken[tenant] = taken + 1
        return True
