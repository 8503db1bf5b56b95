"""Attack review of the wave-workers merge: the start deadline, signals, the supervisor's
start before its logging and reaper (real ``tiergate serve --workers 2`` groups)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.adversarial.test_attack_workers import _gone, _share_dir, serve_config
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import children as _children
from tests.processes import free_port, http_answers, kill, patience, wait_ready
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """The workers' upstream, a simulator with real latency (its default): a stream lasts
    seconds. (Most tests here ask the gateway only for /livez.)"""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1"
    ) as proc:
        yield proc


def _site(tmp_path: Path, hook: str) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(hook, encoding="utf-8")
    return {"PYTHONPATH": str(site)}


# A worker's start that is slow only because it waits for a CPU: for STARVED_CPU_S seconds of
# its own CPU time it runs pinned to one CPU beside the test's busy loops (each of them as
# entitled to that CPU as the worker), then it starts as usual (and says so in STARVED_DONE:
# the busy loops are needed no longer).
_STARVED = """\
import os, time
if "tiergate.worker=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(os.environ["STARVE_ON_CPU"])})
    end = time.process_time() + float(os.environ["STARVED_CPU_S"])
    while time.process_time() < end:
        pass
    os.sched_setaffinity(0, cpus)
    open(os.path.join(os.environ["STARVED_DONE"], str(os.getpid())), "w").close()
"""
_BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@contextlib.contextmanager
def _busy_loops(cpu: int, count: int) -> Iterator[Callable[[], None]]:
    """``count`` busy loops pinned to ``cpu`` (at this process's nice, as the gateway); what
    it gives stops them early (they burn a whole CPU while they run)."""
    loops = [subprocess.Popen([sys.executable, "-c", _BUSY, str(cpu)]) for _ in range(count)]

    def stop() -> None:
        for loop in loops:
            loop.kill()
            loop.wait(10)

    try:
        yield stop
    finally:
        stop()


def _events(gw: GatewayProcess, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in gw.log_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == name]


def test_a_start_slow_for_want_of_a_cpu_is_not_killed_into_an_outage(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    """Both workers' starts are CPU-starved (a loaded node): each needs little of its own
    time but waits for a CPU far longer than ``worker_start_timeout_s``. They are healthy, not
    hung: they must be left to start. (Killed at the deadline, every replacement starts
    from scratch as starved as the last, and three such kills stop the group: exit 1, an
    outage made of a slow start.)"""
    cpu = max(os.sched_getaffinity(0))
    done = tmp_path / "starved"  # a file each, once a worker's starved part is over
    done.mkdir()
    env = {**_site(tmp_path, _STARVED), "STARVE_ON_CPU": str(cpu), "STARVED_CPU_S": "1.5",
           "STARVED_DONE": str(done)}  # fmt: skip
    limit_s = 8.0  # above a worker's own start-up time (~3 s of CPU), below its starved wall time
    config = serve_config(sim, worker_start_timeout_s=limit_s)
    with _busy_loops(cpu, 4) as stop_loops, ForkedGateway(config, workers=2, env=env) as gw:
        deadline = time.monotonic() + patience(60)
        while len(_events(gw, "server.worker_started")) < 2:
            if len(list(done.iterdir())) >= 2:  # both past their starved part (a worker
                stop_loops()  # killed before that one's end: its replacement starves too)
            assert gw.exitcode is None, gw.log_text()[-4000:]
            assert time.monotonic() < deadline, gw.log_text()[-4000:]
            time.sleep(0.2)
        assert _events(gw, "server.worker_start_timeout") == [], gw.log_text()[-4000:]
        assert _events(gw, "server.worker_exited") == []


# The supervisor's own set-up after it started its workers (its logging) takes long, and so
# do the workers' starts: a loaded node, a cold disk. MARK tells the test the supervisor is there.
_SLOW_SET_UP = """\
import os, sys, time
if "tiergate.worker=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
    time.sleep(4)
else:

    class _Slow:
        def find_spec(self, name, path=None, target=None):
            if name == "gateway.telemetry.logging" and not os.path.exists(MARK):
                open(MARK, "w").close()
                time.sleep(60)

    sys.meta_path.insert(0, _Slow())
"""


def test_a_supervisor_killed_while_its_workers_start_leaves_no_group_directory(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    """SIGKILL of the supervisor after it started its workers, before its own set-up and
    theirs ended: the workers exit and the group's directory in /dev/shm is removed, as for
    a supervisor killed any later (the reaper's job: it must run as soon as there are
    workers; a worker still starting has not asked for the kernel's signal yet, and when it
    finds its supervisor gone it ends itself without a drain that would remove it)."""
    mark = tmp_path / "setting-up"
    env = {**os.environ, **_site(tmp_path, _SLOW_SET_UP.replace("MARK", repr(str(mark))))}
    env.pop("TIERGATE_CONFIG", None)
    config = tmp_path / "tiergate.yaml"
    config.write_text(json.dumps(serve_config(sim, shutdown_grace_s=2)), encoding="utf-8")
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port",
           str(free_port()), "--workers", "2"]  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=out, env=env)
    workers: list[int] = []
    share: Path | None = None
    try:
        deadline = time.monotonic() + patience(30)
        while not mark.exists() or len(_children(proc.pid)) < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        workers = _children(proc.pid)
        share = _share_dir(workers[0])
        proc.kill()
        proc.wait(10)
        assert _gone(workers, 20), "a worker outlived its supervisor"
        deadline = time.monotonic() + patience(10)
        while share.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not share.exists(), sorted(p.name for p in share.iterdir())
    finally:
        kill(proc)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if share is not None:
            shutil.rmtree(share, ignore_errors=True)


def _pid1_serve(tmp_path: Path, config: dict[str, Any], workers: int) -> tuple[Any, int, str]:
    """``tiergate serve`` as PID 1 of a PID namespace of its own, as in a container without an
    init (no terminal): the ``unshare`` process, the gateway's pid out here, its URL."""
    path = tmp_path / "tiergate.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TIERGATE_CONFIG"}
    cmd = ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "gateway"]
    cmd += ["serve", "--config", str(path), "--port", str(port), "--workers", str(workers)]
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, lambda: http_answers(url + "/livez"), timeout=30, poll_s=0.1,
               what="gateway (PID 1)", log=log.read_text)  # fmt: skip
    [gateway] = _children(proc.pid)
    return proc, gateway, url


@pytest.mark.parametrize(
    ("workers", "signum"),
    [(1, signal.SIGINT), (1, signal.SIGTERM), (2, signal.SIGINT), (2, signal.SIGTERM)],
)
def test_pid_1_in_a_container_drains_on_sigterm_and_sigint(
    sim: SimulatorProcess, tmp_path: Path, workers: int, signum: int
) -> None:
    """PID 1 without an init (the image's ``CMD tiergate serve``): the kernel delivers it only
    the signals it has a handler for. ``docker stop`` (SIGTERM) and Ctrl-C proxied by
    ``docker run`` (SIGINT, no terminal) both let a running stream end with [DONE], and the
    gateway exits 0 (130 for one process's Ctrl-C), with no traceback."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(
            ["unshare", "--pid", "--fork", "true"], capture_output=True, check=False
        ).returncode
    ):
        pytest.skip("no PID namespaces here (unshare --pid needs privileges)")
    config = serve_config(sim, shutdown_grace_s=30)
    proc, gateway, url = _pid1_serve(tmp_path, config, workers)
    try:
        body = {"model": "fast", "stream": True, "max_tokens": 400,
                "messages": [{"role": "user", "content": "count slowly"}]}  # fmt: skip
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as resp:
            chunks = resp.iter_text()
            first = next(chunks)
            assert first.startswith("data: ")
            os.kill(gateway, signum)
            rest = "".join(chunks)
        code = proc.wait(timeout=patience(40))
        log = (tmp_path / "gateway.log").read_text()
        assert rest.rstrip().endswith("data: [DONE]"), log[-3000:]
        assert "server.stopped" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        # Ctrl-C of one process: 130, as a shell reports an interrupted command.
        assert code == (130 if (workers, signum) == (1, signal.SIGINT) else 0), log[-3000:]
    finally:
        kill(proc)


_HANG_BEFORE_MAIN = """\
import os, time
if "tiergate.worker=0" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "") and not os.path.exists(
    MARK
):
    open(MARK, "w").close()
    time.sleep(3600)  # worker 0's first start hangs before `main()` (a cold disk, an import)
"""


@pytest.mark.xfail(
    strict=True,
    reason="SIGUSR1 reaches a worker that has no handler for it yet (it is registered in "
    "main(), after the interpreter's start and the first imports): its default action ends "
    "the worker (code -10) and no stack is written",
)
def test_a_start_that_hangs_before_main_is_dumped_too(
    sim: SimulatorProcess, tmp_path: Path
) -> None:
    """A start that hangs before ``main()`` (interpreter start-up, ``gateway``'s first imports:
    a cold or hung disk) shows where it hangs, as one that hangs later does."""
    env = _site(tmp_path, _HANG_BEFORE_MAIN.replace("MARK", repr(str(tmp_path / "hung"))))
    # A fixed limit, as in test_a_start_slow_for_want_of_a_cpu_is_not_killed_into_an_outage:
    # a start's wait for a CPU is not counted (a normal one needs ~3 s of its own time).
    config = serve_config(sim, worker_start_timeout_s=10.0)
    with ForkedGateway(config, workers=2, env=env) as gw:
        deadline = time.monotonic() + patience(60)
        while len(_events(gw, "server.worker_started")) < 2:  # worker 1, then the new 0
            assert time.monotonic() < deadline, gw.log_text()[-3000:]
            time.sleep(0.2)
        [exited] = _events(gw, "server.worker_exited")
        assert "most recent call first" in gw.log_text(), gw.log_text()[-3000:]
        assert exited["code"] == -signal.SIGKILL
