"""``tiergate serve --workers 2``: one socket, one prober, every worker's metrics, clean stops."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import yaml

from gateway.__main__ import main as tiergate
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess, tiers_config
from tests.processes import children as _children
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

HEALTH_INTERVAL = 0.2


class _Probed(BaseHTTPRequestHandler):
    """A replica that only answers probes, and counts them."""

    seen: ClassVar[Counter[str]] = Counter()

    def do_GET(self) -> None:
        """200 to /health and /metrics."""
        type(self).seen[self.path] += 1
        body = b"vllm:num_requests_running 0\n" if self.path == "/metrics" else b""
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def probed() -> Iterator[tuple[str, Counter[str]]]:
    """A probe-counting replica on a free port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Probed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Probed.seen
    server.shutdown()


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A simulator with real latency (streams take a while)."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1"
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def gw(sim: SimulatorProcess, probed: tuple[str, Counter[str]]) -> Iterator[GatewayProcess]:
    """Two workers; the precise tier is the probe-counting replica."""
    config = {
        "auth": {"enabled": False},
        "health": {"interval_s": HEALTH_INTERVAL},
        "telemetry": {"access_log": True},
        "tiers": tiers_config([sim.url], [probed[0]]),
    }
    with ForkedGateway(config, workers=2) as proc:
        yield proc


def _workers_seen(gw: GatewayProcess, tries: int = 40) -> set[str]:
    seen: set[str] = set()
    for _ in range(tries):  # a new connection each time: the kernel picks the worker
        text = httpx.get(gw.url + "/metrics", headers={"connection": "close"}).text
        seen |= set(re.findall(r'^tiergate_connections_open\{worker="(\d+)"\}', text, re.M))
    return seen


def test_two_workers_serve_and_each_scrape_shows_both(gw: GatewayProcess) -> None:
    """Two worker processes under the supervisor; any scrape carries both workers' samples."""
    assert len(_children(gw.pid)) == 2
    text = httpx.get(gw.url + "/metrics").text
    deadline = time.monotonic() + patience(10)
    while 'worker="1"' not in text or 'worker="0"' not in text:
        assert time.monotonic() < deadline, text[:2000]
        time.sleep(0.5)
        text = httpx.get(gw.url + "/metrics").text
    assert text.count("# TYPE tiergate_connections_open gauge") == 1  # one family, merged


def test_one_prober_for_the_group(gw: GatewayProcess, probed: tuple[str, Counter[str]]) -> None:
    """Only the leader probes: /health is hit at one worker's rate, not two."""
    time.sleep(1.0)
    start = probed[1]["/health"]
    time.sleep(3.0)
    probes = probed[1]["/health"] - start
    assert 0 < probes <= 1.4 * 3.0 / HEALTH_INTERVAL, probes


def test_logs_are_tagged_with_the_worker(gw: GatewayProcess) -> None:
    """Every worker's log lines say which worker wrote them."""
    body = {"model": "fast", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(30):  # new connections: both workers get some
        httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"connection": "close"})
    deadline = time.monotonic() + patience(10)
    lines: list[str] = []
    while len(lines) < 30 and time.monotonic() < deadline:  # log lines are written async
        time.sleep(0.2)
        lines = [line for line in gw.log_text().splitlines() if "request.finished" in line]
    tags = {m[1] for line in lines if (m := re.search(r'"worker": ?(\d+)', line))}
    assert len(lines) >= 30
    assert tags == {"0", "1"}


def test_a_crashed_worker_is_replaced(gw: GatewayProcess) -> None:
    """kill -9 of one worker: the gateway keeps answering and a new worker takes its place."""
    victim = _children(gw.pid)[1]
    os.kill(victim, signal.SIGKILL)
    for _ in range(20):
        assert httpx.get(gw.url + "/livez", headers={"connection": "close"}).status_code == 200
    deadline = time.monotonic() + patience(30)
    while True:
        children = _children(gw.pid)
        if len(children) == 2 and victim not in children:
            break
        assert time.monotonic() < deadline, children
        time.sleep(0.2)
    (exited, *_) = [line for line in gw.log_text().splitlines() if "server.worker_exited" in line]
    # The supervisor's line goes through the configured logging: JSON, as stderr is no tty.
    assert json.loads(exited)["event"] == "server.worker_exited"


def test_sigterm_lets_running_streams_finish(
    sim: SimulatorProcess, probed: tuple[str, Counter[str]]
) -> None:
    """A stream running when the supervisor gets SIGTERM ends with [DONE]; then all exit."""
    config = {"auth": {"enabled": False}, "tiers": tiers_config([sim.url], [probed[0]])}
    with ForkedGateway(config, workers=2) as gw:
        body = {
            "model": "fast",
            "stream": True,
            "max_tokens": 60,
            "messages": [{"role": "user", "content": "count slowly"}],
        }
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as resp:
            chunks = resp.iter_text()
            first = next(chunks)
            assert first.startswith("data: ")
            os.kill(gw.pid, signal.SIGTERM)
            rest = "".join(chunks)
        assert "data: [DONE]" in first + rest
        assert gw.wait(timeout=30) == 0


def test_ctrl_c_drains_like_sigterm(
    sim: SimulatorProcess, probed: tuple[str, Counter[str]]
) -> None:
    """Ctrl-C at a terminal is SIGINT to the whole process group, the workers included; a
    second one comes while they drain (after the supervisor's SIGTERM). A running stream
    still ends with [DONE] and the group exits 0: uvicorn alone takes a SIGINT after a
    SIGTERM as "quit now" and cuts it."""
    config = {
        "auth": {"enabled": False},
        "server": {"shutdown_grace_s": 30},
        "tiers": tiers_config([sim.url], [probed[0]]),
    }
    with GatewayProcess(config, workers=2, session=True) as gw:
        deadline = time.monotonic() + patience(30)
        while gw.log_text().count("server.worker_started") < 2:  # past start-up, both
            assert time.monotonic() < deadline, gw.log_text()[-3000:]
            time.sleep(0.1)
        body = {
            "model": "fast",
            "stream": True,
            "max_tokens": 2000,  # seconds at the simulator's pace: outlives both Ctrl-Cs
            "messages": [{"role": "user", "content": "count slowly"}],
        }
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=60) as resp:
            chunks = resp.iter_text()
            first = next(chunks)
            assert first.startswith("data: ")
            os.killpg(gw.pid, signal.SIGINT)
            deadline = time.monotonic() + patience(10)
            while gw.log_text().count("server.draining") < 2:  # both workers drain
                assert time.monotonic() < deadline, gw.log_text()[-3000:]
                time.sleep(0.05)
            os.killpg(gw.pid, signal.SIGINT)
            rest = "".join(chunks)
        assert rest.rstrip().endswith("data: [DONE]"), gw.log_text()[-3000:]
        assert gw._proc is not None
        assert gw._proc.wait(timeout=patience(40)) == 0


def test_explicit_workers_with_memory_limits_are_refused(tmp_path: Path) -> None:
    """--workers 2 with keys and in-memory limits exits 2 and says what to change."""
    config = tmp_path / "tiergate.yaml"
    config.write_text(yaml.safe_dump({"auth": {"enabled": True}}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--workers", "2"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "TIERGATE_CONFIG"},
    )
    assert done.returncode == 2
    assert "memory_divide_per_worker" in done.stderr
    assert "ratelimit.backend 'redis'" in done.stderr


def _create_key(keys_file: Path) -> str:
    """``tiergate keys create`` (the command's own code, run in this process: the file it
    writes is what counts here, not the interpreter's start); the key it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert tiergate(["keys", "create", "--keys-file", str(keys_file), "--tenant", "acme"]) == 0
    return out.getvalue().strip().splitlines()[-1]


def test_key_file_changes_reach_every_worker(
    tmp_path: Path, sim: SimulatorProcess, probed: tuple[str, Counter[str]]
) -> None:
    """A key added to the file after start works on every worker within a few seconds."""
    keys_file = tmp_path / "keys.yaml"
    _create_key(keys_file)
    config = {
        "auth": {"enabled": True, "store": "file", "keys_file": str(keys_file)},
        "ratelimit": {"memory_divide_per_worker": True},
        "tiers": tiers_config([sim.url], [probed[0]]),
    }
    with ForkedGateway(config, workers=2) as gw:
        added = _create_key(keys_file)
        auth = {"authorization": f"Bearer {added}", "connection": "close"}
        deadline = time.monotonic() + patience(15)
        statuses: list[int] = []
        while time.monotonic() < deadline:
            statuses = [
                httpx.get(gw.url + "/v1/models", headers=auth).status_code for _ in range(20)
            ]
            if statuses == [200] * 20:
                break
            time.sleep(0.5)
        assert statuses == [200] * 20
        assert len(_children(gw.pid)) == 2


def test_a_worker_whose_supervisor_died_before_it_asked_for_the_signal_exits(
    tmp_path: Path,
) -> None:
    """The kernel's death signal is asked for by the worker as it starts (not between fork
    and exec, where the supervisor's threads make Python code unsafe): a worker whose
    supervisor is already gone (its parent is not the pid it was given) ends itself at once,
    as SIGTERM from the kernel would have ended it."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gateway", "serve", "--workers", "2", "--worker-index", "0"),
            *("--worker-fd", "0", "--share-dir", str(tmp_path), "--supervisor-pid", "1"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]


def test_sigusr1_dumps_every_threads_stack_and_serving_goes_on(gw: GatewayProcess) -> None:
    """``kill -USR1`` a worker or the supervisor: its threads' stacks on stderr (for a process
    that hangs), and nothing stops. Last in this module: the stacks are not JSON lines."""
    # A worker whose start is over (a replaced one still importing has no handler yet, and
    # SIGUSR1's default would end it).
    deadline = time.monotonic() + patience(30)
    while True:
        started = {
            json.loads(line)["pid"]
            for line in gw.log_text().splitlines()
            if "server.worker_started" in line and line.startswith("{")
        }
        ready = [pid for pid in _children(gw.pid) if pid in started]
        if ready:
            break
        assert time.monotonic() < deadline, gw.log_text()[-3000:]
        time.sleep(0.2)
    # Each dump is read until the frame it must show has arrived: a dump is written thread
    # by thread, and the log can be read between two of them (a CI run read the
    # supervisor's worker threads before its main loop).
    for pid, frame in (
        (ready[0], ("uvicorn", "asyncio")),  # a worker's event loop
        (gw.pid, ("gateway/http/workers.py",)),  # the supervisor's loop
    ):
        before = len(gw.log_text())
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + patience(5)
        while True:
            dump = gw.log_text()[before:]
            if "most recent call first" in dump and any(f in dump for f in frame):
                break
            assert time.monotonic() < deadline, dump[-3000:]
            time.sleep(0.1)
    assert len(_children(gw.pid)) == 2
    assert httpx.get(gw.url + "/livez", headers={"connection": "close"}).status_code == 200


_HANG_ONCE = """\
import os, sys, time
if "tiergate.worker=0" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "") and not os.path.exists(
    MARK
):
    open(MARK, "w").close()

    class _Hang:  # worker 0's first start hangs importing the app (serve has set up SIGUSR1)
        def find_spec(self, name, path=None, target=None):
            if name == "gateway.composition":
                time.sleep(3600)

    sys.meta_path.insert(0, _Hang())
"""


def test_a_worker_whose_start_hangs_is_dumped_killed_and_replaced(
    sim: SimulatorProcess, probed: tuple[str, Counter[str]], tmp_path: Path
) -> None:
    """Worker 0's first start never ends (it hangs importing the app): once
    ``server.worker_start_timeout_s`` has passed the supervisor logs why, has the worker's
    stack written to stderr (SIGUSR1: where it hangs), SIGKILLs it and starts another, which
    serves; worker 1 serves all along."""
    site = tmp_path / "site"
    site.mkdir()
    hook = _HANG_ONCE.replace("MARK", repr(str(tmp_path / "hung")))
    (site / "sitecustomize.py").write_text(hook, encoding="utf-8")
    # A normal start must fit, on a loaded machine too: the time a start waits for a CPU is
    # not counted against the limit, so it need not grow with the load (a start needs ~3 s of
    # its own CPU time here). Stretched by ``patience``, it made this test wait up to 80 s.
    start_s = 10.0
    config = {
        "auth": {"enabled": False},
        "server": {"worker_start_timeout_s": start_s},
        "tiers": tiers_config([sim.url], [probed[0]]),
    }
    with ForkedGateway(config, workers=2, env={"PYTHONPATH": str(site)}) as gw:
        deadline = time.monotonic() + start_s + patience(40)
        while gw.log_text().count("server.worker_started") < 2:  # worker 1, then the new 0
            assert time.monotonic() < deadline, gw.log_text()[-3000:]
            time.sleep(0.2)
        log = gw.log_text()
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        [timeout] = [line for line in lines if line["event"] == "server.worker_start_timeout"]
        assert timeout["worker"] == 0
        assert timeout["limit_s"] == start_s
        assert timeout["waited_s"] >= start_s - 0.05  # (rounded to 0.1 s)
        assert "in find_spec" in log  # the hanging frame, dumped before the kill
        exited = [line for line in lines if line["event"] == "server.worker_exited"]
        assert [(e["worker"], e["code"]) for e in exited] == [(0, -signal.SIGKILL)]
        assert len(_children(gw.pid)) == 2
        assert httpx.get(gw.url + "/livez", headers={"connection": "close"}).status_code == 200
