"""The profiler: signals start and stop cProfile in a real gateway; the report reads the stats."""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import signal
import sys
import time
from pathlib import Path

from bench.harness.legs import Placement, start_fixed_upstream
from bench.harness.processes import post_json
from bench.overhead.legs import start_tiergate
from bench.overhead.profile import FINDINGS, Run, areas, render, table
from bench.overhead.profiled_gateway import main as profiled_main
from bench.overhead.variants import VARIANTS

NO_PIN = Placement.build(pin=False, boost=False)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            time.sleep(0.3)
            return
        time.sleep(0.1)
    raise AssertionError(f"no stats at {path}")


def test_signals_profile_only_the_requests_between_them(tmp_path: Path) -> None:
    """SIGUSR1 starts profiling a live gateway, SIGUSR2 writes stats holding the request path."""
    stats_path = tmp_path / "gw.prof"
    upstream = start_fixed_upstream(tmp_path, NO_PIN)
    launcher = (sys.executable, "-m", "bench.overhead.profiled_gateway", str(stats_path))
    try:
        leg = start_tiergate(VARIANTS["plain"], upstream, tmp_path, NO_PIN, launcher=launcher)
        try:
            assert not stats_path.exists()
            os.kill(leg.main.listener_pid(), signal.SIGUSR1)
            time.sleep(0.2)
            for _ in range(20):
                status, _ = post_json(leg.chat_url, json.dumps(leg.body()).encode(), None)
                assert status == 200
            os.kill(leg.main.listener_pid(), signal.SIGUSR2)
            _wait_for(stats_path)
        finally:
            leg.stop()
    finally:
        upstream.stop()
    stats = pstats.Stats(str(stats_path))
    names = {f"{path}:{name}" for path, _, name in stats.stats}  # type: ignore[attr-defined]  # pstats: table untyped
    assert any("gateway/http/proxy.py:handle" in n for n in names)
    assert not any("gateway/http/app.py:create_app" in n for n in names)  # start-up not profiled
    text = render(Run(20, 100.0, 200.0, "cmd"), stats, "plain", 5)
    assert "| gateway (our IO shell) |" in text
    assert "## Top 5 functions by own time" in text


def test_usage_error_without_arguments() -> None:
    """The wrapper refuses to run without a stats file and tiergate arguments."""
    assert profiled_main([]) == 2
    assert profiled_main(["only-a-file"]) == 2


def _work() -> int:
    return sum(json.loads(json.dumps(list(range(50)))))


def test_tables_are_per_request_and_sorted() -> None:
    """Each table line divides by the request count; own-time rows come largest first."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        _work()
    profiler.disable()
    stats = pstats.Stats(profiler)
    lines = table(stats, "tottime", 3, requests=200)
    assert lines[0].startswith("| function | calls / request |")
    own = [float(line.split("|")[3]) for line in lines[2:]]
    assert own == sorted(own, reverse=True)
    assert any("json" in line for line in areas(stats, 200))
    assert FINDINGS == "<!-- findings -->"
