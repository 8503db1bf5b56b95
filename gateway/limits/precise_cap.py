"""The precise-share cap: per key (``max_precise_share``) and per tenant
(``ratelimit.tenant_precise_share``), over a sliding window of the last requests.

Every request of a capped key (or tenant) is counted in its window (the last
``ratelimit.precise_share_window`` requests); one routed to the precise tier, whatever sent it
there (the classifier, a rule such as ``tools``, an explicit ``model: precise``, the
``x-tiergate-tier`` header), goes precise only if the window's precise share, this request
included, stays within the cap. Otherwise the key's policy (``precise_share_over``) says:
``downgrade`` (served by the fast tier, ``x-tiergate-route-reason: policy:precise_share_cap``,
no fallback to precise) or ``refuse`` (429, nothing counted). A capped request counted as fast
never falls back to precise either (a fast-tier outage must not lift the cap). With Redis one
Lua script per window checks and records atomically, so the cap is exact across workers and
replicas; with the memory backend each process keeps its own windows (each within the cap, so
their union is too).

So the precise share of any window of the key's requests is at most the cap, and a key's
first requests are fast until its window has room (a cap of 0.2: the 5th request may be the
first precise one). A key routed above the fleet's share shows in
``tiergate_precise_share_escalated_keys`` (keys, not a label per key).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.config.router_settings import RouterSettings
from gateway.config.settings import RateLimitSettings
from gateway.limits.limits import KeyRateLimited
from gateway.limits.redis import LuaScript, ScriptRunner, script_runner
from policies.principal import Principal
from policies.tiering import RouteDecision

REASON = "policy:precise_share_cap"
LIMIT = "precise_share"
_TTL_S = 86_400  # a window nobody used for a day is forgotten
# KEYS: the window (a list of 0/1, newest first), its precise count. ARGV: wants precise
# (0/1), cap, window size, refuse (0/1), ttl. Returns {allowed (0/1), precise, size}.
_CHECK = """
local want, cap, w, refuse = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4])
local p = tonumber(redis.call('GET', KEYS[2]) or '0')
local n = redis.call('LLEN', KEYS[1])
local drop = n - (w - 1)
local evicted = 0
if drop > 0 then
  for _, b in ipairs(redis.call('LRANGE', KEYS[1], -drop, -1)) do
    evicted = evicted + tonumber(b)
  end
end
local size = math.min(n, w - 1) + 1
local ok = 1
if want == 1 and (p - evicted + 1) > cap * size + 1e-9 then ok = 0 end
if ok == 0 and refuse == 1 then return {0, p, n} end
if drop > 0 then redis.call('LTRIM', KEYS[1], 0, w - 2) end
local bit = 0
if want == 1 and ok == 1 then bit = 1 end
redis.call('LPUSH', KEYS[1], bit)
p = p - evicted + bit
redis.call('SET', KEYS[2], p, 'EX', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return {ok, p, size}
"""
CHECK = LuaScript(_CHECK, keys=2, args=5)
_MAX_WINDOWS = 100_000
_ESCALATION_WINDOW = 200
_ESCALATION_MIN = 50
_ESCALATION_MARGIN = 0.1
_MAX_TRACKED = 10_000


class ShareWindows(Protocol):
    """Check-and-record on one window (``name``): whether a precise request fits."""

    async def check(self, name: str, precise: bool, cap: float, refuse: bool) -> bool:
        """True when the request may go (precise, or fast); False: over the cap."""
        ...


class MemoryShareWindows:
    """One process's windows (the memory backend)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.windows: OrderedDict[str, deque[int]] = OrderedDict()

    async def check(self, name: str, precise: bool, cap: float, refuse: bool) -> bool:
        """As the Redis script, in this process."""
        window = self.windows.get(name)
        if window is None:
            if len(self.windows) >= _MAX_WINDOWS:
                self.windows.popitem(last=False)
            window = self.windows[name] = deque(maxlen=self.size)
        self.windows.move_to_end(name)
        evicted = window[0] if len(window) == self.size else 0
        size = min(len(window), self.size - 1) + 1
        ok = not precise or sum(window) - evicted + 1 <= cap * size + 1e-9
        if not ok and refuse:
            return False
        window.append(1 if precise and ok else 0)
        return ok


class RedisShareWindows:
    """Windows in Redis, shared by every worker and replica (one script per check)."""

    def __init__(
        self, client: Redis, prefix: str, size: int, runner: ScriptRunner | None = None
    ) -> None:
        self.prefix = prefix
        self.size = size
        self._runner = runner or script_runner(client)

    async def check(self, name: str, precise: bool, cap: float, refuse: bool) -> bool:
        """Raises RedisError / OSError when Redis does not answer."""
        base = f"{self.prefix}ps:{{{name}}}"
        args = (int(precise), cap, self.size, int(refuse), _TTL_S)
        reply = await self._runner.run(CHECK, (base, base + ":p"), args)
        return int(reply[0]) == 1

    async def aclose(self) -> None:
        """Close the pipelined connection."""
        await self._runner.aclose()


@dataclass(frozen=True, slots=True)
class TenantCap:
    """A tenant's cap and what happens over it."""

    share: float
    refuse: bool = False


class PreciseShareCap:
    """Applies the key's and the tenant's caps to a route decision; counts what it did."""

    def __init__(
        self,
        windows: ShareWindows,
        *,
        fast: str,
        precise: str,
        tenants: dict[str, TenantCap],
        fallback: ShareWindows | None = None,
    ) -> None:
        self.windows = windows
        self.fallback = fallback  # Redis unreachable: this process's own windows
        self.fast, self.precise = fast, precise
        self.tenants = tenants
        self.actions: Counter[tuple[str, str]] = Counter()

    def applies(self, principal: Principal) -> bool:
        """The key or its tenant has a cap."""
        return principal.policy.max_precise_share is not None or principal.tenant in self.tenants

    async def apply(
        self, decision: RouteDecision, tiers: tuple[str, ...], principal: Principal
    ) -> tuple[RouteDecision, tuple[str, ...]]:
        """The decision and tiers after the caps; raises a 429 under a ``refuse`` policy."""
        precise = decision.tier == self.precise
        policy = principal.policy
        checks: list[tuple[str, str, float, bool]] = []
        if policy.max_precise_share is not None:
            refuse = policy.precise_share_over == "refuse"
            checks.append(("key", f"k:{principal.key_id}", policy.max_precise_share, refuse))
        tenant = self.tenants.get(principal.tenant)
        if tenant is not None:
            checks.append(("tenant", f"t:{principal.tenant}", tenant.share, tenant.refuse))
        for scope, name, cap, refuse in checks:
            if await self._check(name, precise, cap, refuse):
                continue
            # A key that may not use fast has nowhere to be downgraded to: refused (counted
            # as not precise, so a share of its requests still goes through).
            if refuse or not policy.allows_tier(self.fast):
                self.actions[(scope, "refused")] += 1
                raise KeyRateLimited(
                    f"This {scope}'s precise-tier share is capped at {cap:g} of its recent "
                    "requests; send it to the fast tier or try again later.",
                    limit=LIMIT,
                    headers={"retry-after": "1"},
                )
            self.actions[(scope, "downgraded")] += 1
            precise = False
            decision = RouteDecision(self.fast, REASON, decision.score)
            tiers = tuple(t for t in tiers if t != self.precise) or (self.fast,)
        if not precise:  # counted as fast: a fallback to precise would escape the window
            tiers = tuple(t for t in tiers if t != self.precise) or (self.fast,)
        return decision, tiers

    async def _check(self, name: str, precise: bool, cap: float, refuse: bool) -> bool:
        try:
            return await self.windows.check(name, precise, cap, refuse)
        except (RedisError, OSError):
            if self.fallback is None:
                raise
            return await self.fallback.check(name, precise, cap, refuse)


class EscalationTracker:
    """Each key's recent precise share in this process, for one gauge without key labels."""

    def __init__(self, fleet_share: Callable[[], float]) -> None:
        self.fleet_share = fleet_share
        self.keys: OrderedDict[str, deque[bool]] = OrderedDict()

    def record(self, key_id: str, precise: bool) -> None:
        """One routed request of ``key_id``."""
        recent = self.keys.get(key_id)
        if recent is None:
            if len(self.keys) >= _MAX_TRACKED:
                self.keys.popitem(last=False)
            recent = self.keys[key_id] = deque(maxlen=_ESCALATION_WINDOW)
        else:
            self.keys.move_to_end(key_id)
        recent.append(precise)

    def escalated(self) -> int:
        """Keys whose recent share is above the fleet's by more than the margin."""
        bar = self.fleet_share() + _ESCALATION_MARGIN
        return sum(
            1
            for recent in self.keys.values()
            if len(recent) >= _ESCALATION_MIN and sum(recent) / len(recent) > bar
        )


class PreciseShareCollector:
    """``tiergate_precise_share_cap_total{scope,action}`` and the escalated-keys gauge."""

    def __init__(self, cap: PreciseShareCap | None, tracker: EscalationTracker) -> None:
        self.cap = cap
        self.tracker = tracker

    def collect(self) -> Iterator[Metric]:
        """The prometheus_client collector protocol."""
        actions = CounterMetricFamily(
            "tiergate_precise_share_cap",
            "Requests over a precise-share cap, by cap (key or tenant) and what was done.",
            labels=["scope", "action"],
        )
        counts = self.cap.actions if self.cap is not None else Counter()
        for scope in ("key", "tenant"):
            for action in ("downgraded", "refused"):
                actions.add_metric([scope, action], counts[(scope, action)])
        yield actions
        yield GaugeMetricFamily(
            "tiergate_precise_share_escalated_keys",
            f"Keys whose precise share over their last {_ESCALATION_WINDOW} requests (at least "
            f"{_ESCALATION_MIN}) is {_ESCALATION_MARGIN:g} above the fleet's (this process).",
            value=self.tracker.escalated(),
        )


def build_precise_cap(
    rl: RateLimitSettings, router: RouterSettings, *, client: Redis | None, key_prefix: str
) -> tuple[PreciseShareCap, RedisShareWindows | None]:
    """The cap over Redis windows (``client``) or this process's; the Redis windows to close."""
    local = MemoryShareWindows(rl.precise_share_window)
    remote = None
    if client is not None:
        remote = RedisShareWindows(client, key_prefix, rl.precise_share_window)
    refuse = rl.tenant_precise_share_over == "refuse"
    cap = PreciseShareCap(
        remote or local,
        fast=router.fast_tier,
        precise=router.precise_tier,
        tenants={name: TenantCap(share, refuse) for name, share in rl.tenant_precise_share.items()},
        fallback=local if remote is not None and rl.on_redis_error == "open" else None,
    )
    return cap, remote
