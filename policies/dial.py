"""The cost dial per tenant: one share controller for each tenant, a fleet default target.

The threshold a tenant's ``auto`` requests meet is learnt from that tenant's own scores only,
so no other tenant's traffic can move it (issue 34: one key's crafted prompts raised everyone's
threshold). A tenant without a controller yet (new, or evicted when more than ``max_tenants``
are active) meets the artifact's calibration for its target, never another tenant's threshold.

Targets are :class:`DialTargets`: a fleet default and per-tenant overrides, versioned so that
every worker and replica applies the same change once (``gateway/dial_sync.py`` carries them).

Pure standard library: this module is part of the policy core.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, NamedTuple, TypeVar

from policies.threshold import ControllerConfig, ControllerState, ShareController

T = TypeVar("T")
DEFAULT_MAX_TENANTS = 256
WARM_START = 200  # scores from which a controller jumps to its window's quantile


def dial_config(target_share: float) -> ControllerConfig:
    """The gateway's controller tuning: a 5,000-request window, bounded steps once it is
    full, and straight to the window's quantile while young (from 200 scores) or when the
    dial is turned (warm start)."""
    return ControllerConfig(
        target_share=target_share, min_samples=WARM_START, warm_start=WARM_START
    )


def check_share(share: float) -> float:
    """``share`` if it is a number within [0, 1]; ``ValueError`` otherwise."""
    if isinstance(share, bool) or not isinstance(share, int | float):
        raise ValueError("a share must be a number within [0, 1]")  # noqa: TRY004  # a value error to callers
    if math.isnan(share) or not 0.0 <= share <= 1.0:
        raise ValueError(f"a share must be within [0, 1], got {share!r}")
    return float(share)


@dataclass(frozen=True, slots=True)
class DialTargets:
    """The fleet's default target share and the tenants' own targets, with a version."""

    default: float
    tenants: Mapping[str, float] = field(default_factory=dict)
    version: int = 0

    def target_for(self, tenant: str) -> float:
        """The tenant's own target, else the fleet default."""
        return self.tenants.get(tenant, self.default)


class View(NamedTuple):
    """One worker's word on one tenant: its threshold, how many scores it rests on, and the
    target it aims at."""

    threshold: float
    scores: int
    target: float


def combine(views: Iterable[Mapping[str, View]], targets: DialTargets) -> dict[str, float]:
    """Each tenant's fleet threshold: the workers' thresholds weighted by their scores, from
    the views that aim at the tenant's current target (a worker that has not applied a
    change yet does not count). Only a tenant's own views enter its threshold."""
    sums: dict[str, list[float]] = {}
    for view in views:
        for tenant, (threshold, scores, target) in view.items():
            if target != targets.target_for(tenant) or scores <= 0:
                continue
            acc = sums.setdefault(tenant, [0.0, 0.0])
            acc[0] += threshold * scores
            acc[1] += scores
    return {tenant: total / weight for tenant, (total, weight) in sums.items()}


class TenantDial:
    """Per-tenant share controllers (at most ``max_tenants``, least recently used evicted).

    ``calibrate(share)`` is the threshold for ``share`` before any traffic is seen: the
    artifact's reference calibration (or a fixed start). Not thread-safe: one per event loop.
    """

    def __init__(
        self,
        config: ControllerConfig,
        calibrate: Callable[[float], float],
        targets: DialTargets | None = None,
        *,
        max_tenants: int = DEFAULT_MAX_TENANTS,
    ) -> None:
        if max_tenants < 1:
            raise ValueError("max_tenants must be at least 1")
        self._config = config
        self._calibrate = calibrate
        self._calibrated: dict[float, float] = {}
        self.targets = targets or DialTargets(config.target_share)
        self.max_tenants = max_tenants
        self._controllers: OrderedDict[str, ShareController] = OrderedDict()
        self.evicted = 0
        # The fleet's threshold per tenant: every worker's own, weighted by its scores
        # (set_fleet); decisions use it, so a tenant meets one threshold on every worker.
        self._fleet: dict[str, float] = {}

    def _start(self, share: float) -> float:
        threshold = self._calibrated.get(share)
        if threshold is None:
            threshold = self._calibrated[share] = self._calibrate(share)
        return threshold

    def threshold_for(self, tenant: str) -> float:
        """The threshold this tenant's requests meet now: the fleet's for the tenant when
        known, else this worker's own controller's, else the calibration for its target."""
        fleet = self._fleet.get(tenant)
        if fleet is not None:
            return fleet
        return self.own_threshold(tenant)

    def own_threshold(self, tenant: str) -> float:
        """What this worker's controller for ``tenant`` says (its own traffic only)."""
        controller = self._controllers.get(tenant)
        if controller is not None:
            return controller.threshold
        return self._start(self.targets.target_for(tenant))

    def local_view(self) -> dict[str, View]:
        """This worker's tenants with enough scores to speak for: threshold, scores, target."""
        return {
            tenant: View(c.threshold, c.scores, c.config.target_share)
            for tenant, c in self._controllers.items()
            if c.scores >= max(1, c.config.warm_start)
        }

    def set_fleet(self, thresholds: Mapping[str, float]) -> None:
        """The fleet's thresholds per tenant (``combine`` of every worker's view)."""
        self._fleet = dict(thresholds)

    def observe(self, tenant: str, sent_precise: bool, score: float | None = None) -> None:
        """Record one classifier decision of ``tenant`` in its own controller."""
        controllers = self._controllers
        controller = controllers.get(tenant)
        if controller is None:
            controller = self._new(tenant)
        else:
            controllers.move_to_end(tenant)
        controller.observe(sent_precise, score)

    def _new(self, tenant: str) -> ShareController:
        share = self.targets.target_for(tenant)
        controller = ShareController(replace(self._config, target_share=share), self._start(share))
        self._controllers[tenant] = controller
        if len(self._controllers) > self.max_tenants:
            self._controllers.popitem(last=False)
            self.evicted += 1
        return controller

    def apply(self, targets: DialTargets) -> list[str]:
        """Take new targets; every controller whose target changed re-aims at once (warm
        start from its window). The tenants whose target changed, in no particular order."""
        self.targets = targets
        changed = []
        for tenant, controller in self._controllers.items():
            share = targets.target_for(tenant)
            if share != controller.config.target_share:
                controller.retarget(share, self._start(share))
                self._fleet.pop(tenant, None)  # until the workers' views agree again
                changed.append(tenant)
        return changed

    def reseed(
        self, calibrate: Callable[[float], float], scores: Mapping[str, Iterable[float]]
    ) -> None:
        """A new artifact: new calibration, and every controller's window replaced by the
        given tenant's scores under it (recent traffic rescored). A tenant with no scores
        starts afresh from the new calibration."""
        self._calibrate = calibrate
        self._calibrated.clear()
        self._fleet.clear()
        for tenant, controller in list(self._controllers.items()):
            share = controller.config.target_share
            fresh = ShareController(controller.config, self._start(share))
            fresh.seed(scores.get(tenant, ()))
            self._controllers[tenant] = fresh

    def tenants(self) -> list[str]:
        """Tenants with a controller, least recently seen first."""
        return list(self._controllers)

    def state(self, tenant: str) -> ControllerState:
        """The tenant's threshold, target and observed share (an empty window for a tenant
        without a controller)."""
        controller = self._controllers.get(tenant)
        if controller is not None:
            return controller.state()
        share = self.targets.target_for(tenant)
        return ControllerState(self._start(share), share, 0.0, 0, 0)


class FixedDial:
    """A fixed threshold for every tenant (``router.threshold`` with online control off)."""

    def __init__(self, threshold: float, targets: DialTargets) -> None:
        self.fixed = threshold
        self.targets = targets

    def threshold_for(self, tenant: str) -> float:
        """The same threshold for everyone."""
        return self.fixed

    def observe(self, tenant: str, sent_precise: bool, score: float | None = None) -> None:
        """A fixed threshold ignores traffic."""

    def apply(self, targets: DialTargets) -> list[str]:
        """Targets are recorded but move nothing: the threshold is fixed."""
        self.targets = targets
        return []

    def tenants(self) -> list[str]:
        """No tenant has a controller."""
        return []

    def own_threshold(self, tenant: str) -> float:
        """The fixed threshold."""
        return self.fixed

    def local_view(self) -> dict[str, View]:
        """Nothing to share."""
        return {}

    def set_fleet(self, thresholds: Mapping[str, float]) -> None:
        """A fixed threshold takes no fleet value."""

    def state(self, tenant: str) -> ControllerState:
        """The fixed threshold and the tenant's (unused) target."""
        return ControllerState(self.fixed, self.targets.target_for(tenant), 0.0, 0, 0)


class RecentSample(Generic[T]):
    """The most recent items of each tenant, at most ``capacity`` in all, tenant-balanced.

    What a reloaded artifact is calibrated on (the requests are scored again under it before
    it goes live). When full, an item of the tenant holding the most is dropped, so a tenant
    that floods keeps at most an even share and cannot push the others' out.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: dict[str, deque[T]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, tenant: str, item: T) -> None:
        """Keep ``item`` as ``tenant``'s newest."""
        items = self._items
        own = items.get(tenant)
        if own is None:
            own = items[tenant] = deque()
        own.append(item)
        self._size += 1
        if self._size > self.capacity:
            fair = self.capacity // len(items)
            victim = own if len(own) > fair else max(items.values(), key=len)
            victim.popleft()
            self._size -= 1
            if not victim:
                del items[next(t for t, v in items.items() if v is victim)]

    def by_tenant(self) -> dict[str, list[T]]:
        """Each tenant's items, oldest first."""
        return {tenant: list(items) for tenant, items in self._items.items()}
