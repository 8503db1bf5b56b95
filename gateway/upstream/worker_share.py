"""What the workers of one gateway share: the leader's health results and every worker's metrics.

``tiergate serve --workers N`` runs N processes behind one listening socket. Only worker 0
(the leader) probes the replicas (scraping vLLM's ``/metrics`` N times as often hurts it); it
writes what it learned to ``health.json`` in the group's directory after every round, and the
other workers read that file on the same interval. Every worker writes its Prometheus samples,
labelled ``worker``, to ``metrics-<i>.prom`` each second; a scrape of any worker returns its own
live samples plus the others' latest files, as one exposition (``sum without (worker)``
aggregates). Files are replaced atomically (write, then rename), so readers never see half.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gateway.pipeline.tasks import stop_tasks
from gateway.upstream.replicas import Replica, ReplicaPool

_log = structlog.get_logger("tiergate.server")
HEALTH_FILE = "health.json"
METRICS_PUBLISH_S = 1.0
_SHARED_FIELDS = (
    "healthy",
    "checked",
    "running",
    "waiting",
    "kv_usage",
    "prefix_queries",
    "prefix_hits",
    "last_check_at",
    "scraped_at",
    "check_failures",
    "check_successes",
    "misconfigured",
    "max_model_len",
    "sleep_state",
    "waiting_capacity",
    "drain_per_s",
    "rejecting",
    "engine_slots",
    "server_load",
    "load_tracked",
)


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """Which worker of how many this process is, and where the group shares files."""

    index: int
    count: int
    share_dir: Path

    @property
    def leader(self) -> bool:
        """Worker 0 probes the replicas for the group."""
        return self.index == 0


def metrics_file(share_dir: Path, index: int) -> Path:
    """Where worker ``index`` publishes its samples: rewritten every second while its event
    loop runs, so the supervisor also reads it as the worker's heartbeat."""
    return share_dir / f"metrics-{index}.prom"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _replicas(pools: Mapping[str, ReplicaPool]) -> Iterator[tuple[str, Replica]]:
    for tier, pool in pools.items():
        for replica in pool.replicas:
            yield f"{tier} {replica.url}", replica


class HealthShare:
    """The leader's replica health, written to and read from the group's directory."""

    def __init__(self, role: WorkerRole, pools: Mapping[str, ReplicaPool]) -> None:
        self.path = role.share_dir / HEALTH_FILE
        self.pools = pools

    def snapshot(self) -> bytes:
        """The shared fields of every replica, as JSON."""
        return json.dumps(
            {key: {f: getattr(r, f) for f in _SHARED_FIELDS} for key, r in _replicas(self.pools)}
        ).encode()

    async def publish(self) -> None:
        """Write the current state (the leader, after each probe round)."""
        await asyncio.to_thread(_write_atomic, self.path, self.snapshot())

    def apply(self, data: bytes) -> None:
        """Copy the leader's state onto this worker's replicas."""
        state = json.loads(data)
        for key, replica in _replicas(self.pools):
            fields = state.get(key)
            if fields is not None:
                for name in _SHARED_FIELDS:
                    setattr(replica, name, fields[name])

    async def follow(self) -> None:
        """Read the leader's latest state, if any (the followers, on the probe interval)."""
        try:
            data = await asyncio.to_thread(self.path.read_bytes)
        except FileNotFoundError:
            return  # the leader has not finished its first round yet
        self.apply(data)


def _labelled(families: Iterable[Metric], worker: str) -> Iterator[Metric]:
    for family in families:
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        for s in family.samples:
            copy.add_sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp)
        yield copy


class _Labelled(Collector):
    def __init__(self, registry: CollectorRegistry, worker: str) -> None:
        self.registry = registry
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        return _labelled(self.registry.collect(), self.worker)


class GroupMetrics(Collector):
    """This worker's live samples and the other workers' last published ones, merged by name."""

    def __init__(self, role: WorkerRole, registry: CollectorRegistry) -> None:
        self.role = role
        self.own = CollectorRegistry(auto_describe=False)
        self.own.register(_Labelled(registry, str(role.index)))
        self._task: asyncio.Task[None] | None = None
        # The file is the heartbeat the supervisor watches, so it is written on a thread of
        # its own: the loop's default pool is shared (``loop.getaddrinfo``, ``to_thread``)
        # and slow DNS or file reads can take every thread of it for longer than
        # ``server.worker_stall_s``, while the loop itself runs.
        self._writer: ThreadPoolExecutor | None = None
        self._supervisor = os.getppid()

    def _path(self, index: int) -> Path:
        return metrics_file(self.role.share_dir, index)

    def _others(self) -> Iterator[Metric]:
        for index in range(self.role.count):
            if index == self.role.index:
                continue
            with contextlib.suppress(FileNotFoundError):
                text = self._path(index).read_text(encoding="utf-8")
                yield from text_string_to_metric_families(text)

    def collect(self) -> Iterator[Metric]:
        """One family per name, with every worker's samples."""
        merged: dict[str, Metric] = {}
        for family in [*self.own.collect(), *self._others()]:
            into = merged.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            into.samples.extend(family.samples)
        return iter(merged.values())

    async def _publish_forever(self) -> None:
        path = self._path(self.role.index)
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            try:
                data = generate_latest(self.own)
                await loop.run_in_executor(self._writer, _write_atomic, path, data)
            except OSError as exc:  # the directory gone, /dev/shm full: try again next round
                if not failing:
                    _log.warning("server.metrics_publish_failed", error=exc.strerror)
                with contextlib.suppress(OSError):  # the heartbeat goes on where it can
                    os.utime(path)
                failing = True
            else:
                failing = False
            await asyncio.sleep(METRICS_PUBLISH_S)

    def start(self) -> None:
        """Publish this worker's samples every second, in the background."""
        if self._task is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiergate-beat")
            self._task = asyncio.create_task(self._publish_forever(), name="tiergate-metrics")

    async def stop(self) -> None:
        """Stop publishing; remove the group's directory if the supervisor is gone."""
        task, self._task = self._task, None
        await stop_tasks(task)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=False)  # a write under way ends on its own
        if os.getppid() != self._supervisor:  # SIGKILLed: it will not remove the directory
            await asyncio.to_thread(shutil.rmtree, self.role.share_dir, ignore_errors=True)
