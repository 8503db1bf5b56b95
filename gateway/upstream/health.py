"""Knowing the replicas: active health checks and a scrape of each replica's ``/metrics``.

One background task (started at app start-up, cancelled at shutdown) probes every replica of
every tier each ``interval_s``: first, once, what the replica is (:mod:`gateway.upstream.backends`:
its kind, detected for ``auto``, and its probe route), then ``GET`` on that route (vLLM's
``/health`` answers 200 when the engine is alive; the tier's ``health_path`` overrides it),
then, when healthy, the kind's ``/metrics`` for the engine's own load and cache counters (a
vLLM engine whose ``engine_sleep_state`` is not awake counts as unhealthy) and, every
``MODELS_REFRESH_S``, ``/v1/models`` for the context length (``max_model_len``). A
refused connection or a non-200 answer (vLLM's dead engine) marks a replica unhealthy at
once; timeouts, which may be a passing stall, do so after ``unhealthy_after`` in a row. It
turns healthy again after ``healthy_after`` good probes. Passive outlier ejection (from real
traffic) lives in :mod:`gateway.upstream.replicas`; the two are independent and both keep a replica
out of rotation.

Sample names come from the kind (:data:`policies.backends.KINDS`). For vLLM both the current
metric names and the deprecated ones are parsed; the current name wins when a page has
both (``vllm:kv_cache_usage_perc`` over ``vllm:gpu_cache_usage_perc``,
``vllm:prefix_cache_*`` over ``vllm:gpu_prefix_cache_*``).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from gateway.pipeline.tasks import stop_tasks
from gateway.upstream import backends, signals
from gateway.upstream.connection import UpstreamConnectionError
from gateway.upstream.keys import UpstreamKeys
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import ErrorRecord, Replica, ReplicaPool
from gateway.upstream.worker_share import HealthShare
from policies.backends import KINDS, MODELS_PATH, BackendKind, Probe
from policies.vllm_surface import AWAKE, model_max_len, sleep_state

_log = structlog.get_logger("tiergate.health")
_MAX_METRICS_BYTES = 4 << 20
# How often a misconfigured replica's credentials are tried again (GET /v1/models).
_RECHECK_CREDENTIALS_S = 5.0
# A probe that timed out while the replica served the gateway's requests: no verdict.
_BUSY: Final = ("busy", False)
# How often each replica's /v1/models is read for its context length (max_model_len).
MODELS_REFRESH_S = 60.0


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one ``/metrics`` page says; ``None`` where the page has no such sample."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    prefix_hit_rate: float | None = None


STALE_SCRAPES = 3  # failed scrapes in a row after which a replica's last reading is dropped
_RATIOS = frozenset({"kv_usage", "prefix_hit_rate"})
_LOAD_FIELDS = (
    "running",
    "waiting",
    "kv_usage",
    "prefix_queries",
    "prefix_hits",
    "prefix_hit_rate",
)


def parse_metrics(text: str, kind: BackendKind = KINDS["vllm"]) -> EngineLoad:
    """Sum each of the kind's samples over its label sets (engines, models); ratios: the max."""
    found: dict[str, tuple[int, float]] = {}
    names, prefix = kind.metrics, kind.metric_prefix
    if not names:
        return EngineLoad()
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        sample = signals.sample_line(line)
        if sample is None or sample[0] not in names:
            continue
        field, rank = names[sample[0]]
        value = sample[2]
        held = found.get(field)
        if held is None or rank < held[0]:
            found[field] = (rank, value)
        elif rank == held[0]:
            merged = max(held[1], value) if field in _RATIOS else held[1] + value
            found[field] = (rank, merged)
    # A sum that overflowed is no reading either.
    return EngineLoad(**{f: v for f, (_, v) in found.items() if math.isfinite(v)})


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """How often and how patiently replicas are probed."""

    interval_s: float = 0.5
    timeout_s: float = 0.5
    unhealthy_after: int = 2
    healthy_after: int = 1
    scrape_metrics: bool = True
    metrics_every: int = 1


class HealthMonitor:
    """Probes every replica on an interval and keeps their state on the Replica objects.

    With a ``share`` (several workers), the leader publishes each round's results and a
    ``follower`` reads them instead of probing: one prober per gateway process group.
    """

    def __init__(
        self,
        pools: Mapping[str, ReplicaPool],
        config: HealthConfig,
        credentials: Mapping[str, Mapping[str, str]] | None = None,
        *,
        share: HealthShare | None = None,
        follower: bool = False,
        keys: Mapping[str, UpstreamKeys] | None = None,
        served_models: Mapping[str, str] | None = None,
    ) -> None:
        self.pools = pools
        self.config = config
        # Per tier, the upstream Authorization header: a replica marked misconfigured (it
        # refused the gateway's key) is re-checked on /v1/models, so a fixed backend returns
        # to service, and to readiness, without waiting for traffic that readiness keeps away.
        self.credentials = credentials or {}
        self._credentials_checked: dict[tuple[str, str], float] = {}
        # Per tier: its keys when it has several (the one each replica takes), and the model
        # name whose card in /v1/models states the context length.
        self.keys = keys or {}
        self.served_models = served_models or {}
        self.share = share
        self.follower = follower
        self.client: UpstreamPool | None = None
        self.rounds = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def replicas(self) -> list[Replica]:
        """Every replica of every tier."""
        return [r for pool in self.pools.values() for r in pool.replicas]

    def start(self, client: UpstreamPool) -> None:
        """Start probing in the background with the gateway's upstream client (its probes' pool)."""
        self.client = client
        if self._task is None:
            # A clean context: started during a request, the task must not log that
            # request's id and trace id on every probe for the rest of its life.
            self._task = asyncio.create_task(
                self._run(), name="tiergate-health", context=contextvars.Context()
            )

    async def stop(self) -> None:
        """Cancel the background task and wait for it to end."""
        task, self._task = self._task, None
        await stop_tasks(task)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._round()
            except Exception:  # noqa: BLE001  # one replica's surprise must not end all checks
                _log.exception("health.round_failed")
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.config.interval_s - elapsed))

    async def _round(self) -> None:
        share = self.share
        if share is None:
            await self.check_once()
            return
        try:
            if self.follower:
                await share.follow()
                self._refresh_contexts()
                self.rounds += 1
                return
            await self.check_once()
            await share.publish()
        except (OSError, ValueError) as exc:  # a full disk or a torn file: next round
            _log.warning("health.share_failed", error=type(exc).__name__)

    async def check_once(self) -> None:
        """Probe every replica once, concurrently."""
        await asyncio.gather(*(self._probe(r) for r in self.replicas))
        self._refresh_contexts()
        self.rounds += 1

    def _refresh_contexts(self) -> None:
        now = time.perf_counter()
        for pool in self.pools.values():
            pool.refresh_context()
            pool.decay_speeds(now)
            for replica in pool.replicas:
                signals.refresh_slots(replica)

    def readiness(self) -> dict[str, bool] | None:
        """Per tier: is some replica healthy? ``None`` until every replica was probed."""
        if not all(r.checked for r in self.replicas):
            return None
        return {tier: pool.ready() for tier, pool in self.pools.items()}

    async def _probe(self, replica: Replica) -> None:
        if not replica.resolved and not backends.probe_would_queue(replica):
            await backends.resolve(replica, self._detect_get(replica), self.config.timeout_s)
        if backends.probe_would_queue(replica):  # asked again: detection may just have found it
            # Its requests in flight show it alive; a probe would wait behind them (and make
            # llama-cpp-python end a running stream early). Traffic decides until it is idle.
            replica.checked = True  # known alive: /readyz need not probe it itself
            return
        failure = await self._health(replica)
        if failure is _BUSY:
            replica.checked = True
            return
        if failure is None and self.config.scrape_metrics:
            await self._engine_state(replica)
            failure = _asleep(replica)
        self._apply(replica, failure)
        if failure is not None and failure[0].endswith("could not connect"):
            backends.forget(replica)
            replica.models_read_at = 0.0  # its context is read again once it is back
        if failure is None and replica.misconfigured:
            await self._recheck_credentials(replica)
        if failure is None and _models_due(replica, time.monotonic()):
            await self._read_context(replica)

    def _headers(self, replica: Replica) -> Mapping[str, str] | None:
        """The Authorization the replica takes now (its tier's key), if any."""
        keys = self.keys.get(replica.tier)
        if keys is not None:
            return keys.for_replica(replica.url)
        return self.credentials.get(replica.tier)

    async def _read_context(self, replica: Replica) -> None:
        """``max_model_len`` from the replica's model card (kept when it does not answer)."""
        replica.models_read_at = time.monotonic()
        timeout_s = backends.probe_timeout(replica, self.config.timeout_s)
        try:
            status, body = await self._get(
                replica.url + MODELS_PATH, self._headers(replica), timeout_s
            )
        except (TimeoutError, UpstreamConnectionError):
            return
        if status == 200:
            model = self.served_models.get(replica.tier, "")
            replica.max_model_len = model_max_len(body, model)

    async def _recheck_credentials(self, replica: Replica) -> None:
        now = time.monotonic()
        key = (replica.tier, replica.url)
        if now - self._credentials_checked.get(key, -math.inf) < _RECHECK_CREDENTIALS_S:
            return
        self._credentials_checked[key] = now
        keys = self.keys.get(replica.tier)
        tries = keys.headers if keys is not None else (self.credentials.get(replica.tier, {}),)
        for index, headers in enumerate(tries):
            try:
                status, _ = await self._get(replica.url + "/v1/models", headers)
            except (TimeoutError, UpstreamConnectionError):
                return
            if status == 200:
                if keys is not None:
                    keys.use(replica.url, index)
                replica.misconfigured = False
                _log.info("replica.credentials_accepted", tier=replica.tier, replica=replica.name)
                return

    async def _get(
        self, url: str, headers: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        client = self.client
        if client is None:
            raise RuntimeError("the health monitor has no client yet")
        async with asyncio.timeout(timeout_s or self.config.timeout_s):
            return await client.get(url, headers, limit=_MAX_METRICS_BYTES)

    def _detect_get(self, replica: Replica) -> backends.Getter:
        """GETs for detection, with the tier's upstream credentials (a model list may need them)."""
        headers = self._headers(replica)

        async def get(url: str, timeout_s: float) -> Probe:
            try:
                status, body = await self._get(url, headers, timeout_s)
            except (TimeoutError, UpstreamConnectionError):
                return Probe(None)
            return Probe(status, body[:65536])

        return get

    async def _health(self, replica: Replica) -> tuple[str, bool] | None:
        """``None`` when the probe route answered 200, else why not and whether that is final."""
        path = replica.health_path
        timeout_s = backends.probe_timeout(replica, self.config.timeout_s)
        try:
            status, _ = await self._get(replica.url + path, self._headers(replica), timeout_s)
        except TimeoutError:
            if replica.busy(time.monotonic()):
                # Busy, not gone: a server answering the gateway's own requests is alive. One
                # that left them unanswered past the tier's own timeouts is not (a hung
                # server keeps requests in flight as long as traffic comes).
                replica.last_probe_error = (
                    f"health check: {path} timed out after {timeout_s:g}s with "
                    f"{replica.in_flight} requests in flight (busy: not counted)"
                )
                return _BUSY
            return f"health check: {path} timed out after {timeout_s:g}s", False
        except UpstreamConnectionError:
            return "health check: could not connect", True
        if status == 200:
            return None
        return f"health check: {path} answered {status}", True

    def _apply(self, replica: Replica, failure: tuple[str, bool] | None) -> None:
        now = time.monotonic()
        replica.last_check_at = now
        replica.checked = True
        if failure is None:
            replica.check_failures = 0
            replica.check_successes += 1
            if not replica.healthy and replica.check_successes >= self.config.healthy_after:
                replica.healthy = True
                _log.info(
                    "replica.healthy", tier=replica.tier, replica=replica.name, label=replica.label
                )
            return
        error, definitive = failure
        replica.last_probe_error = error
        replica.check_successes = 0
        replica.check_failures += 1
        threshold = 1 if definitive else self.config.unhealthy_after
        if replica.healthy and replica.check_failures >= threshold:
            replica.healthy = False
            replica.recent_errors.append(ErrorRecord(time.time(), "health_check", error))
            _log.warning(
                "replica.unhealthy",
                tier=replica.tier,
                replica=replica.name,
                label=replica.label,
                reason=error,
            )

    async def _engine_state(self, replica: Replica) -> None:
        """``/metrics`` every ``metrics_every`` rounds; between, vLLM's ``/load`` unless the
        replica showed it does not track load (0 while the gateway had requests there)."""
        config = self.config
        if (
            self.rounds % config.metrics_every == 0
            or replica.load_tracked is False
            or backends.kind_of(replica).name != "vllm"
        ):
            await self._scrape(replica)
            return
        try:
            status, body = await self._get(replica.url + signals.LOAD_PATH)
        except (TimeoutError, UpstreamConnectionError):
            return
        load = signals.parse_load(body) if status == 200 else None
        if not signals.absorb_load(replica, load):
            _log.info("replica.load_untracked", tier=replica.tier, replica=replica.name)

    async def _scrape(self, replica: Replica) -> None:
        kind = backends.kind_of(replica)
        if kind.metrics_path is None or not kind.metrics:
            return  # a server without Prometheus load numbers: the gateway's own counts only
        try:
            status, body = await self._get(replica.url + kind.metrics_path)
        except (TimeoutError, UpstreamConnectionError):
            _missed(replica, definitive=False)  # /health decides liveness
            return
        if status != 200:
            _missed(replica, definitive=True)
            return
        replica.scrape_misses = 0
        page = body.decode("utf-8", "replace")
        load = parse_metrics(page, kind)
        replica.sleep_state = sleep_state(page)
        for field in _LOAD_FIELDS:
            value = getattr(load, field)
            if value is not None:
                setattr(replica, field, value)
        replica.scraped_at = time.monotonic()
        signals.absorb(replica, signals.parse_signals(page), replica.scraped_at)


def _missed(replica: Replica, *, definitive: bool) -> None:
    """A scrape that failed keeps the last numbers for ``STALE_SCRAPES`` rounds (a busy
    server's page may be slow); after that, or at once when the page answered an error, the
    engine's own counts are forgotten and the gateway's in-flight counts decide, as for a
    server without metrics. A stale "full" would otherwise hold the replica at 0 slots for
    good: with nothing sent there, nothing shows it has room again."""
    replica.scrape_misses += 1
    if definitive or replica.scrape_misses >= STALE_SCRAPES:
        replica.running = replica.waiting = 0.0
        replica.waiting_capacity = replica.server_load = None
        replica.rejecting = False
        signals.refresh_slots(replica)


def _asleep(replica: Replica) -> tuple[str, bool] | None:
    """A sleeping vLLM engine still answers ``/health`` 200, but generates nothing: a
    definitive failure while ``vllm:engine_sleep_state`` says anything but awake."""
    state = replica.sleep_state
    if state is None or state == AWAKE:
        return None
    return f"engine asleep (vllm:engine_sleep_state: {state})", True


def _models_due(replica: Replica, now: float) -> bool:
    """Time to read the replica's context length again? Never on a one-at-a-time server
    (llama-cpp-python): its model list waits behind a generation, a waiting request makes that
    server cut the running stream (another gateway's, too, which this one cannot see), and it
    states no ``max_model_len`` to read."""
    kind = KINDS.get(replica.kind or "")
    if kind is not None and kind.serial:
        return False
    return replica.models_read_at == 0 or now - replica.models_read_at >= MODELS_REFRESH_S
