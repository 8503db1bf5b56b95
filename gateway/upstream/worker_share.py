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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

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


def _write_beat(path: Path, data: bytes) -> OSError | None:
    """Write a worker's metrics file (on its writer's thread); the error, if it failed (the
    directory gone, /dev/shm full): the file's time is then touched where it can be, so the
    heartbeat goes on."""
    try:
        _write_atomic(path, data)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.utime(path)
        return exc
    return None


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
        # The file is the heartbeat the supervisor watches (``server.worker_stall_s``), so
        # it must show that the loop runs, not how busy it is: a timer's callback asks for
        # each write (late by at most the pass it waits for; a sleeping task woken by a
        # write's completion waited for about four passes, seconds each under overload),
        # and a thread of its own writes it (the loop's default pool is shared, with
        # ``loop.getaddrinfo`` and ``to_thread``: slow DNS can take every thread of it).
        self._timer: asyncio.Handle | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._write: Future[OSError | None] | None = None
        self._failing = False
        self._supervisor = os.getppid()

    def _path(self, index: int) -> Path:
        return metrics_file(self.role.share_dir, index)

    def _published(self, index: int) -> list[Metric] | None:
        """Worker ``index``'s last published samples (``None`` before its first file)."""
        try:
            text = self._path(index).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        return list(text_string_to_metric_families(text))

    def collect(self) -> Iterator[Metric]:
        """One family per name, with every worker's samples, as last published.

        This worker's own samples come from its file too (live only before its first one):
        whichever worker a scrape reaches, it then serves the same snapshot of each, so no
        counter goes down from one scrape to the next. Own live samples beside the others'
        published ones did: a series read live (4) by one scrape was read from its second-old
        file (3) by the next, which another worker answered, and Prometheus takes a drop for
        a restart (``rate`` counts the whole value again). Samples are at most
        ``METRICS_PUBLISH_S`` old.
        """
        families: list[Metric] = []
        for index in range(self.role.count):
            published = self._published(index)
            if published is None and index == self.role.index:
                published = list(self.own.collect())
            families += published or []
        merged: dict[str, Metric] = {}
        for family in families:
            into = merged.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            into.samples.extend(family.samples)
        return iter(merged.values())

    def _beat(self) -> None:
        """Ask the writer for this second's file (on the loop, from the timer)."""
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(METRICS_PUBLISH_S, self._beat)
        last, writer = self._write, self._writer
        if writer is None:
            return
        if last is not None:
            if not last.done():
                return  # the last write is still under way (a slow disk): this one waits
            self._note(last.result())
        path = self._path(self.role.index)
        self._write = writer.submit(_write_beat, path, generate_latest(self.own))

    def _note(self, error: OSError | None) -> None:
        if error is not None and not self._failing:
            _log.warning("server.metrics_publish_failed", error=error.strerror)
        self._failing = error is not None

    def start(self) -> None:
        """Publish this worker's samples every second, in the background."""
        if self._timer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiergate-beat")
            self._timer = asyncio.get_running_loop().call_soon(self._beat)

    async def stop(self) -> None:
        """Stop publishing; remove the group's directory if the supervisor is gone."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        writer, self._writer, self._write = self._writer, None, None
        if writer is not None:
            writer.shutdown(wait=False)  # a write under way ends on its own
        if os.getppid() != self._supervisor:  # SIGKILLed: it will not remove the directory
            await asyncio.to_thread(shutil.rmtree, self.role.share_dir, ignore_errors=True)
