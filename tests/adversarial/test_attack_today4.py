"""Attack of the day's merges (fourth pass): the key feed and the key lookups' back-off, the
group's reaper, replica labels, the caller's sampling flag.

Real processes at the edges: ``redis-server``, a TCP listener that accepts and never answers
(a Redis that no longer serves reads), ``tiergate serve --workers 2``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from gateway.access.auth import KeyAuthenticator
from gateway.access.key_feed import KeyChangeFeed
from gateway.access.keystore_redis import RedisKeyStore
from gateway.config.redis_client import BackendHealth, open_redis
from gateway.config.settings import RedisSettings
from policies.keys import KeyRecord, KeyStoreUnavailable, new_key_id
from tests.adversarial.test_attack_workers import (
    _reapers,
    _share_dir,
    _wait_watched,
    serve_config,
)
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess, tiers_config
from tests.processes import free_port, http_answers, patience, silent_port, terminate, wait_ready
from tests.redis_server import RedisServer, redis_server
from tests.simulator.procs import SimulatorProcess

__all__ = ["redis_server"]


@pytest.fixture
def silent_redis() -> Iterator[int]:
    """A port that accepts connections and never answers: every read times out."""
    with silent_port() as port:
        yield port


class CountingStore(RedisKeyStore):
    """The Redis key store, counting reads."""

    gets = 0

    async def get(self, key_id: str) -> KeyRecord | None:
        self.gets += 1
        return await super().get(key_id)


async def test_feed_messages_do_not_open_the_floodgates_to_a_failing_store(
    redis_server: RedisServer, silent_redis: int
) -> None:
    """Pub/sub answering (a confirmation, anyone's PUBLISH on the channel) is no proof that
    the store's reads do: while reads time out, a stream of feed messages must not turn the
    lookups' back-off (one try per retry interval) into one Redis read per request, each
    holding its caller for socket_timeout_s."""
    store_client = open_redis(
        RedisSettings(url=f"redis://127.0.0.1:{silent_redis}/0", socket_timeout_s=0.3)
    )
    feed_client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=2.0))
    publisher = Redis.from_url(redis_server.url)
    store = CountingStore(store_client)
    health = BackendHealth("redis", down_event="down", up_event="up", retry_interval_s=30.0)
    auth = KeyAuthenticator(store, cache_ttl_s=600.0, unknown_ttl_s=600.0, health=health)
    feed = KeyChangeFeed(
        feed_client, store.channel, auth.cache, retry_interval_s=0.05, store_health=health
    )
    feed.start()
    try:
        deadline = time.monotonic() + 10
        while feed.subscriptions == 0:
            assert time.monotonic() < deadline, "the feed never subscribed"
            await asyncio.sleep(0.01)
        with pytest.raises(KeyStoreUnavailable):  # the first read times out: back-off begins
            await auth.authenticate(f"Bearer tg-{new_key_id()}-{'x' * 43}")
        assert not health.healthy
        store.gets = 0
        refused = 0
        for _ in range(10):  # a hostile (or merely busy) publisher on the channel
            generation = auth.cache.generation
            await publisher.publish(store.channel, "EVERYTHING")
            while auth.cache.generation == generation:  # the feed has applied it
                assert time.monotonic() < deadline + 20, "the feed never applied a message"
                await asyncio.sleep(0.005)
            tokens = [f"Bearer tg-{new_key_id()}-{'x' * 43}" for _ in range(5)]
            results = await asyncio.gather(
                *(auth.authenticate(t) for t in tokens), return_exceptions=True
            )
            refused += sum(isinstance(r, KeyStoreUnavailable) for r in results)
        assert refused == 50
        # Within one retry interval: at most one early try, not one per request.
        assert store.gets <= 1, f"{store.gets} reads of a failing store in 10 feed messages"
    finally:
        await feed.stop()
        await publisher.aclose()
        await feed_client.aclose()
        await store_client.aclose()


_SUBREAPER = """\
import ctypes
import runpy

ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans come here, as to PID 1
runpy.run_module("gateway", run_name="__main__", alter_sys=True)
"""


def _zombies_of(parent: int) -> list[int]:
    """Children of ``parent`` that exited and were never reaped (state Z)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit():
                fields = (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
                if fields[0] == "Z" and int(fields[1]) == parent:
                    found.append(int(entry.name))
    return found


def _workers_of(supervisor: int) -> list[int]:
    """The supervisor's two workers (its children with a ``--worker-index``), once started."""
    deadline = time.monotonic() + patience(30)
    while True:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text("ascii")
        workers = []
        for pid in children.split():
            with contextlib.suppress(OSError):
                if b"--worker-index" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    workers.append(int(pid))
        if len(workers) == 2:
            return workers
        assert time.monotonic() < deadline, children
        time.sleep(0.1)


@pytest.mark.slow
def test_a_replaced_reaper_is_reaped_by_a_supervisor_that_is_pid_1(tmp_path: Path) -> None:
    """The supervisor as PID 1 of a container without an init (a subreaper here: orphans are
    handed to it alike): the detached reaper is its child then, so a reaper that died and was
    replaced must be reaped, not left a zombie per restart."""
    (tmp_path / "subreaper_gateway.py").write_text(_SUBREAPER, encoding="utf-8")
    with SimulatorProcess("--profile", "fast", "--model", "tiergate-fast") as sim:
        gw = GatewayProcess(
            serve_config(sim, shutdown_grace_s=2),
            workers=2,
            module="subreaper_gateway",
            env={"PYTHONPATH": str(tmp_path)},
        ).start()
        share: Path | None = None
        try:
            workers = _workers_of(gw.pid)
            share = _share_dir(workers[0])
            _wait_watched(share, workers)
            for _ in range(2):
                [reaper] = _reapers(share)
                os.kill(reaper, signal.SIGKILL)
                _wait_watched(share, workers, besides=reaper)
            deadline = time.monotonic() + patience(10)
            while zombies := _zombies_of(gw.pid):
                assert time.monotonic() < deadline, f"reapers left as zombies: {zombies}"
                time.sleep(0.1)
        finally:
            gw.stop()
            if share is not None:
                shutil.rmtree(share, ignore_errors=True)


@contextlib.contextmanager
def _self_naming(status: int) -> Iterator[tuple[GatewayProcess, int]]:
    """A gateway in front of a backend whose every error names its own host:port."""
    port = free_port()
    command = [sys.executable, "-m", "tests.adversarial.key_echo_upstream", "--port", str(port),
               "--status", str(status), "--shape", "address"]  # fmt: skip
    upstream = subprocess.Popen(command, cwd=REPO_ROOT)  # our own test server
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(upstream, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                   what="self-naming upstream", log=lambda: "")  # fmt: skip
        tier = {"replicas": [url]}
        config = {
            "auth": {"enabled": False},
            "tiers": {"fast": {"model": "m", **tier}, "precise": {"model": "m2", **tier}},
        }
        with GatewayProcess(config) as gateway:
            gateway.wait_until_ready()
            yield gateway, port
    finally:
        terminate(upstream)


@pytest.mark.slow
@pytest.mark.parametrize("status", [400, 500, 200])
def test_a_backend_naming_its_own_address_never_shows_it_to_callers(status: int) -> None:
    """Callers' errors name a replica by label (fast#1), never its host:port: a backend whose
    error quotes its own address (a proxy, a server naming itself; 400 passed on, 500 in the
    502's reasons, 200 then an in-band error event) must not hand that address to the caller
    either. The rest of its message is kept, and nothing else a caller reads names it."""
    with _self_naming(status) as (gateway, port):
        chat = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}
        seen = []
        for body in (chat, {**chat, "stream": True}):
            answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
            seen.append(answer.text + repr(answer.headers.raw))
            if status != 200 or body.get("stream"):
                assert "could not serve" in answer.text, answer.text
        for path in ("/v1/models", "/v1/models/fast", "/readyz", "/livez"):
            answer = httpx.get(gateway.url + path, timeout=10)
            seen.append(answer.text + repr(answer.headers.raw))
        leaks = [text[:400] for text in seen if str(port) in text]
        assert not leaks, leaks


@pytest.mark.slow
def test_a_process_group_kill_leaves_no_group_directory(tmp_path: Path) -> None:
    """``kill -KILL -<pgid>`` (a process manager killing the group, a terminal's job killed):
    the supervisor, its workers and the reaper all die at once, and nobody removed the group's
    directory in /dev/shm (a leak per kill, in memory). Nothing of the group may be left."""
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        json.dumps(
            {
                "auth": {"enabled": False},
                "server": {"shutdown_grace_s": 2},
                "telemetry": {"access_log": False},
                "tiers": tiers_config(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]),
            }
        ),
        encoding="utf-8",
    )
    port = free_port()
    command = [sys.executable, "-m", "gateway", "serve", "--config", str(config),
               "--port", str(port), "--workers", "2"]  # fmt: skip
    with (tmp_path / "gateway.log").open("wb") as log:
        supervisor = subprocess.Popen(  # our own gateway
            command, cwd=REPO_ROOT, stdout=log, stderr=log, start_new_session=True
        )
    share: Path | None = None
    try:
        wait_ready(supervisor, lambda: http_answers(f"http://127.0.0.1:{port}/livez"),
                   timeout=patience(30), poll_s=0.1, what="gateway", log=lambda: "")  # fmt: skip
        workers = _workers_of(supervisor.pid)
        share = _share_dir(workers[0])
        _wait_watched(share, workers)
        os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait(10)
        deadline = time.monotonic() + patience(15)
        while share.exists() or _reapers(share):
            assert time.monotonic() < deadline, (share.exists(), _reapers(share))
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait(10)
        if share is not None:
            for pid in _reapers(share):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(share, ignore_errors=True)
