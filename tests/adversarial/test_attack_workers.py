"""Attacks on ``tiergate serve --workers N``: its worker processes killed, stopped and crashing
the way production does it (the OOM killer picks one worker, a node drains, a rolling deploy),
with real gateway processes, the simulator as the upstream and the official openai client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from gateway.upstream.worker_share import GroupMetrics, WorkerRole, metrics_file
from tests.adversarial.keys_stack import CHAT, bearer, redis_key
from tests.adversarial.rawhttp import connect
from tests.adversarial.test_attack_fleet import SLOT_LEASE_S, gateway_config, wait_slots
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import children as _children
from tests.processes import patience
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

STREAM = {
    "model": "fast",
    "stream": True,
    "max_tokens": 2000,  # about 7 s at the simulator's pace: outlives every check below
    "messages": [{"role": "user", "content": "count slowly"}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """One simulator with real latency: streams last seconds."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1"
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def steady(sim: SimulatorProcess) -> Iterator[ForkedGateway]:
    """``serve --workers 2`` with the default settings, shared by the tests that kill or stop
    one worker and leave the group serving again with two workers: each first waits until
    both of the group's workers serve, and reads only the log written since it began."""
    with ForkedGateway(serve_config(sim), workers=2) as gw:
        yield gw


def serve_config(sim: SimulatorProcess, **server: Any) -> dict[str, Any]:
    return {
        "auth": {"enabled": False},
        "server": server,
        "telemetry": {"access_log": False},
        "tiers": tiers_config([sim.url], [sim.url]),
    }


def _wait_workers(gw: GatewayProcess, count: int, gone: int | None = None) -> list[int]:
    """The supervisor's children once there are ``count`` of them (``gone`` not among them)."""
    deadline = time.monotonic() + patience(30)
    while True:
        children = _children(gw.pid)
        if len(children) == count and gone not in children:
            return children
        assert time.monotonic() < deadline, (children, gw.log_text()[-3000:])
        time.sleep(0.1)


def _holder(port: int, client: socket.socket, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the gateway's end of ``client``'s connection."""
    client_port = client.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text(encoding="ascii").splitlines()[1:]:
        fields = line.split()
        local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if local == port and remote == client_port:
            inode = fields[9]
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                        return pid
    return None


def _livez(sock: socket.socket) -> bytes:
    """One keep-alive ``GET /livez`` on ``sock``; the bytes of its answer (b"" if closed)."""
    sock.sendall(b"GET /livez HTTP/1.1\r\nhost: gw\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    return data


def _connections_on(gw: GatewayProcess, pid: int, want: int = 2) -> list[socket.socket]:
    """Keep-alive connections (one answered request each) the kernel gave worker ``pid``."""
    mine: list[socket.socket] = []
    for _ in range(200):
        sock = connect(gw.port, timeout=60)
        assert _livez(sock).startswith(b"HTTP/1.1 200")
        if _holder(gw.port, sock, [pid]) == pid:
            mine.append(sock)
            if len(mine) == want:
                return mine
        else:
            sock.close()
    raise AssertionError(f"the kernel never gave worker {pid} a connection")


@pytest.mark.slow
def test_a_draining_group_refuses_new_connections(sim: SimulatorProcess) -> None:
    """SIGTERM to the supervisor: running streams finish, new connections are refused at once
    (as with one process), not queued unserved until the drain ends and then reset."""
    with ForkedGateway(serve_config(sim, shutdown_grace_s=20), workers=2) as gw:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=STREAM, timeout=60) as r:
            chunks = r.iter_text()
            assert next(chunks).startswith("data: ")
            os.kill(gw.pid, signal.SIGTERM)
            refused = False
            deadline = time.monotonic() + 3.0  # the stream runs for seconds more
            while not refused and time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", gw.port), timeout=1):
                        time.sleep(0.1)  # accepted by the kernel: try again
                except (ConnectionRefusedError, ConnectionResetError):  # (reset: a handshake
                    refused = True  # under way when the listener closed)
            rest = "".join(chunks)
        assert refused, "connections were still accepted 3 s into the drain"
        assert rest.rstrip().endswith("data: [DONE]")
        assert gw.wait(timeout=patience(30)) == 0


@pytest.mark.slow
def test_a_killed_worker_costs_only_its_own_requests(steady: ForkedGateway) -> None:
    """SIGKILL of one worker under steady load (streams and whole answers, openai client): the
    port never refuses, only requests that worker held fail, and a new worker takes its place
    and serves."""
    gw = steady
    gw.wait_until_ready()
    workers = _wait_workers(gw, 2)
    _wait_serving(gw, workers)  # a worker another test had replaced included
    victim = workers[1]
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0]

    def load(stream: bool) -> None:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        while not stop.is_set():
            try:
                if stream:
                    body = client.chat.completions.create(
                        model="fast", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=40, stream=True,
                    )  # fmt: skip
                    assert list(body)
                else:
                    client.chat.completions.create(
                        model="fast", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=8,
                    )  # fmt: skip
                done[0] += 1
            except openai.APIError as exc:
                errors.append(exc)
        client.close()

    threads = [threading.Thread(target=load, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.5)
        os.kill(victim, signal.SIGKILL)
        _wait_workers(gw, 2, gone=victim)
        after = done[0]
        deadline = time.monotonic() + patience(10)
        while done[0] < after + 20:
            assert time.monotonic() < deadline, errors
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    refused = [e for e in errors if isinstance(e.__cause__, httpx.ConnectError)]
    assert refused == []
    assert len(errors) <= len(threads), errors  # at most the requests in flight then
    statuses = {httpx.get(gw.url + "/readyz", headers={"connection": "close"}).status_code
                for _ in range(10)}  # fmt: skip
    assert statuses == {200}
    _assert_one_series_each(httpx.get(gw.url + "/metrics").text)


def _assert_one_series_each(exposition: str) -> None:
    """Every sample of a scrape is one series (a duplicate fails the whole scrape), and the
    respawned worker's samples are there."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    workers: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in seen, key
            seen.add(key)
            workers.add(sample.labels.get("worker", ""))
    assert {"0", "1"} <= workers


@pytest.mark.slow
def test_a_stopped_worker_is_replaced(steady: ForkedGateway) -> None:
    """A worker that stops answering (SIGSTOP, a wedged event loop) is killed and replaced
    within ``server.worker_stall_s`` (10 s): requests on its connections end instead of
    hanging forever, and new connections go to the live worker meanwhile."""
    gw = steady
    logged = len(gw.log_text())
    workers = _wait_workers(gw, 2)
    _wait_serving(gw, workers)  # a worker another test had replaced included
    victim = workers[1]
    held = _connections_on(gw, victim)
    os.kill(victim, signal.SIGSTOP)
    try:
        for _ in range(10):  # the kernel's queue is shared: the live worker takes them
            answer = httpx.get(gw.url + "/livez", headers={"connection": "close"}, timeout=2)
            assert answer.status_code == 200
        started = time.monotonic()
        for sock in held:
            sock.settimeout(patience(20))
            with contextlib.suppress(ConnectionResetError):
                assert _livez(sock) == b""  # cut, not answered and not hanging
        assert time.monotonic() - started < patience(20)
        _wait_workers(gw, 2, gone=victim)
        assert "server.worker_stalled" in gw.log_text()[logged:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        for sock in held:
            sock.close()


def _share_dir(worker: int) -> Path:
    """The group directory a worker was started with (its ``--share-dir``)."""
    argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
    return Path(argv[argv.index(b"--share-dir") + 1].decode())


def _gone(pids: list[int], within: float) -> bool:
    """Whether every one of ``pids`` has exited within ``within`` seconds."""
    deadline = time.monotonic() + patience(within)
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@dataclass
class _Group:
    """A ``serve --workers 2`` under test and what its clean-up needs, filled in as found."""

    gw: GatewayProcess
    workers: list[int] = field(default_factory=list)
    share: Path | None = None


@contextlib.contextmanager
def _group(sim: SimulatorProcess, env: dict[str, str] | None = None) -> Iterator[_Group]:
    """``serve --workers 2`` (shutdown grace 2 s) in front of ``sim``; afterwards it is stopped,
    any worker left is SIGKILLed and the group's directory removed (a test that killed the
    supervisor leaves nobody else to do it)."""
    group = _Group(ForkedGateway(serve_config(sim, shutdown_grace_s=2), workers=2, env=env).start())
    try:
        yield group
    finally:
        group.gw.stop()
        for pid in group.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if group.share is not None:
            shutil.rmtree(group.share, ignore_errors=True)


@pytest.mark.slow
def test_the_supervisor_killed_takes_its_workers_along(sim: SimulatorProcess) -> None:
    """SIGKILL of the supervisor: every worker exits (it had a stream running), the port is
    free again and the group's directory in /dev/shm is removed; nothing is left behind."""
    with _group(sim) as g:
        gw = g.gw
        workers = g.workers = _wait_workers(gw, 2)
        share = _share_dir(workers[0])
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=STREAM, timeout=60) as r:
            assert next(r.iter_text()).startswith("data: ")
            gw.kill()
            assert _gone(workers, 15), "orphan workers"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", gw.port), timeout=1).close()
        assert not share.exists(), sorted(p.name for p in share.iterdir())


def _reapers(share: Path) -> list[int]:
    """The group's reaper processes (``python -m gateway.http.reaper``), found by its
    directory: not children of the supervisor (it detaches)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit():
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"gateway.http.reaper" in argv and str(share).encode() in argv:
                    found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_stopped_worker_does_not_outlive_a_killed_supervisor(sim: SimulatorProcess) -> None:
    """SIGKILL of the supervisor while a worker is stopped (SIGSTOP): that worker exits too
    (resumed, it drains like the others), the port is free, the group's directory is gone,
    and no process of the group is left."""
    with _group(sim) as g:
        gw = g.gw
        gw.wait_until_ready()
        workers = g.workers = _wait_workers(gw, 2)
        share = g.share = _share_dir(workers[0])
        _wait_serving(gw, workers)  # both past start-up: SIGTERM has its handler in each
        _wait_watched(share, workers)
        os.kill(workers[1], signal.SIGSTOP)
        _wait_stopped(workers[1])
        gw.kill()
        assert _gone(workers, 10), "a stopped worker outlived its supervisor"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", gw.port), timeout=1).close()
        assert _gone_dir(share, 10), sorted(p.name for p in share.iterdir())
        assert _gone(_reapers(share), 10), "the reaper stayed"


@pytest.mark.slow
def test_a_killed_reaper_is_replaced(sim: SimulatorProcess) -> None:
    """The group's reaper SIGKILLed: the supervisor starts another and hands it the running
    workers, so a worker stopped when the supervisor is killed later still exits."""
    with _group(sim) as g:
        gw = g.gw
        gw.wait_until_ready()
        workers = g.workers = _wait_workers(gw, 2)
        share = g.share = _share_dir(workers[0])
        [first] = _reapers(share)
        os.kill(first, signal.SIGKILL)
        _wait_watched(share, workers, besides=first)
        assert _logged(gw, "server.reaper_exited")
        _wait_serving(gw, workers)
        os.kill(workers[1], signal.SIGSTOP)
        _wait_stopped(workers[1])
        gw.kill()
        assert _gone(workers, 10), "the new reaper did not get the workers"
        assert _gone_dir(share, 10)


_WEDGE = """\
import os, signal, time
if "tiergate.worker=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
    # SIGUSR1 wedges the worker's event loop: a blocking call that SIGTERM does not end
    signal.signal(signal.SIGUSR1, lambda *_: time.sleep(3600))
"""


@pytest.mark.slow
def test_a_wedged_worker_does_not_outlive_a_killed_supervisor(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    """SIGKILL of the supervisor while a worker's event loop is wedged (it takes SIGTERM but
    never drains): that worker is killed within ``shutdown_grace_s`` + 10 s."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_WEDGE, encoding="utf-8")
    with _group(sim, env={"PYTHONPATH": str(site)}) as g:
        gw = g.gw
        gw.wait_until_ready()
        workers = g.workers = _wait_workers(gw, 2)
        share = g.share = _share_dir(workers[0])
        _wait_serving(gw, workers)
        os.kill(workers[1], signal.SIGUSR1)
        _wait_wedged(metrics_file(share, 1))
        gw.kill()
        killed_at = time.monotonic()
        assert _gone(workers, 30), "a wedged worker outlived its supervisor"
        assert time.monotonic() - killed_at > 2, "killed before its grace"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", gw.port), timeout=1).close()
        assert _gone_dir(share, 10)


def _wait_serving(gw: GatewayProcess, workers: list[int]) -> None:
    """Until each of ``workers`` has answered a request (its start-up is over)."""
    deadline = time.monotonic() + patience(30)
    for pid in workers:
        for sock in _connections_on(gw, pid, want=1):
            sock.close()
        assert time.monotonic() < deadline


def _wait_wedged(beat: Path) -> None:
    """Until a worker's heartbeat file (rewritten every second while its loop runs) stays
    the same for 2.5 s."""
    deadline = time.monotonic() + patience(20)
    last = beat.stat().st_mtime_ns
    while True:
        time.sleep(2.5)
        now = beat.stat().st_mtime_ns
        if now == last:
            return
        last = now
        assert time.monotonic() < deadline, "the worker's event loop still runs"


def _watched(reaper: int) -> set[int]:
    """The processes ``reaper`` holds a pidfd of (``Pid:`` in its descriptors' fdinfo)."""
    pids = set()
    with contextlib.suppress(OSError):
        for info in Path(f"/proc/{reaper}/fdinfo").iterdir():
            with contextlib.suppress(OSError):
                for line in info.read_text(encoding="ascii").splitlines():
                    if line.startswith("Pid:"):
                        pids.add(int(line.split()[1]))
    return pids


def _wait_watched(share: Path, workers: list[int], besides: int | None = None) -> None:
    """Until a reaper of the group (not ``besides``) holds a pidfd of each of ``workers``."""
    deadline = time.monotonic() + patience(10)
    while not any(set(workers) <= _watched(pid) for pid in _reapers(share) if pid != besides):
        assert time.monotonic() < deadline, {pid: _watched(pid) for pid in _reapers(share)}
        time.sleep(0.05)


def _logged(gw: GatewayProcess, event: str) -> bool:
    """Whether ``event`` reaches the log within seconds (a thread of the process writes it)."""
    deadline = time.monotonic() + patience(5)
    while event not in gw.log_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_stopped(pid: int) -> None:
    """Until ``pid`` is in the stopped state (``T`` in /proc/PID/stat)."""
    deadline = time.monotonic() + patience(10)
    while Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"worker {pid} did not stop"
        time.sleep(0.05)


def _gone_dir(path: Path, within: float) -> bool:
    """Whether ``path`` is removed within ``within`` seconds."""
    deadline = time.monotonic() + patience(within)
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


_SLOW_START = """\
import os, time
if "tiergate.worker=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
    time.sleep(6)  # a worker's start-up on a loaded node: longer than five seconds
"""


@pytest.mark.slow
def test_workers_that_never_start_stop_the_group(sim: SimulatorProcess, tmp_path: Path) -> None:
    """Worker 0 fails at every start (its metrics port is taken) after a slow start-up (6 s):
    the supervisor gives up after three failed starts (exit 1, server.workers_failing) instead
    of restarting it forever."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_START, encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = serve_config(sim)
        config["telemetry"]["metrics_port"] = taken.getsockname()[1]
        with ForkedGateway(config, workers=2, env={"PYTHONPATH": str(site)}) as gw:
            code = gw.wait(timeout=patience(60))  # worker 1 answers; worker 0 keeps failing
            assert code == 1, gw.log_text()[-3000:]
            assert "server.workers_failing" in gw.log_text()


@pytest.mark.slow
def test_a_killed_workers_slots_free_within_the_lease() -> None:
    """SIGKILL of the worker holding one of a key's two Redis concurrency slots: that slot is
    free within the slot lease, while the other worker keeps (renews) its own."""
    stalling = SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0",
        "--stall-first-byte", "1", "--stall-seconds", "120",
    )  # fmt: skip
    with RedisServer() as redis, stalling:
        record, token = asyncio.run(redis_key(redis.url, max_concurrency=2))
        with ForkedGateway(gateway_config(redis, stalling.url), workers=2) as gw:
            workers = _wait_workers(gw, 2)
            held = {pid: _connections_on(gw, pid, want=1)[0] for pid in workers}
            body = json.dumps(CHAT).encode()
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
                f"authorization: {bearer(token)['Authorization']}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            try:
                for sock in held.values():
                    sock.sendall(head.encode() + body)
                wait_slots(redis.url, record.key_id, 2)
                os.kill(workers[1], signal.SIGKILL)
                killed_at = time.monotonic()
                while asyncio.run(_live_slots(redis.url, record.key_id)) != 1:
                    waited = time.monotonic() - killed_at
                    assert waited < SLOT_LEASE_S + 5, f"slot still held {waited:.0f}s after"
                    time.sleep(0.25)
                time.sleep(2)  # the survivor renews its own: still held
                assert asyncio.run(_live_slots(redis.url, record.key_id)) == 1
            finally:
                for sock in held.values():
                    sock.close()


async def _live_slots(url: str, key_id: str) -> int:
    """The key's concurrency slots in Redis whose lease has not run out."""
    client = Redis.from_url(url)
    try:
        seconds, micros = await client.time()
        now_us = seconds * 1_000_000 + micros
        return int(await client.zcount(f"tiergate:rl:{{{key_id}}}:c", now_us, "+inf"))
    finally:
        await client.aclose()


async def test_a_failed_metrics_write_does_not_end_publishing(tmp_path: Path) -> None:
    """A worker's metrics file that cannot be written for a while (the group's directory
    gone, /dev/shm full) is written again once it can: the worker's samples in every scrape,
    and the heartbeat the supervisor watches, go on."""
    share = tmp_path / "group"  # not there yet: the first writes fail
    group = GroupMetrics(WorkerRole(1, 2, share), CollectorRegistry())
    group.start()
    try:
        await asyncio.sleep(0.3)  # the first write has failed meanwhile
        share.mkdir()
        deadline = time.monotonic() + patience(5)
        while not metrics_file(share, 1).exists():
            assert time.monotonic() < deadline, "publishing ended at the first failed write"
            await asyncio.sleep(0.05)
    finally:
        await group.stop()
