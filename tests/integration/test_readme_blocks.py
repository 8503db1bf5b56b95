"""Every README shell block marked `<!-- test: run -->` runs as printed against the demo stack.

The convention is described in tests/markdown_blocks.py. The demo stack is the real
``scripts/demo.sh`` (two simulators and the gateway) on free ports with its state in a
temporary directory, so a developer's own ``.demo/`` and port 8080 are left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.markdown_blocks import REPO, marked_blocks, run_blocks, scratch_dir
from tests.processes import free_port

pytestmark = pytest.mark.slow


class DemoStack:
    """``scripts/demo.sh`` in its own process group; stopped with SIGTERM like Ctrl-C."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ports = {8080: free_port(), 8101: free_port(), 8102: free_port()}
        self.output = state.parent / "demo.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> DemoStack:
        """Start the demo and wait for its banner."""
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIERGATE_")}
        env.update(
            DEMO_STATE=str(self.state),
            DEMO_GATEWAY_PORT=str(self.ports[8080]),
            DEMO_FAST_PORT=str(self.ports[8101]),
            DEMO_PRECISE_PORT=str(self.ports[8102]),
        )
        with self.output.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(REPO / "scripts/demo.sh")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while "Press Ctrl-C" not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"demo did not start:\n{self.text()}")
            time.sleep(0.2)
        return self

    def text(self) -> str:
        """What the demo printed so far."""
        return self.output.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM the demo's process group and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    """The demo stack on free ports."""
    stack = DemoStack(tmp_path_factory.mktemp("demo") / "state").start()
    try:
        yield stack
    finally:
        stack.stop()


def test_readme_has_marked_blocks() -> None:
    """The README marks its demo, openai and config blocks for running."""
    assert len(marked_blocks(REPO / "README.md")) >= 3


def test_readme_blocks_run_as_printed(demo: DemoStack, tmp_path: Path) -> None:
    """The marked README blocks exit 0 and show what the README says they show."""
    cwd = scratch_dir(tmp_path / "clone", {".demo": demo.state})
    result = run_blocks(marked_blocks(REPO / "README.md"), cwd=cwd, ports=demo.ports)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert '"id":"tiergate-precise"' in out  # /v1/models
    assert "[simulated reply" in out  # the demo's answers say they are simulated
    assert "tiergate_requests_total{" in out  # /metrics with the admin token
    assert '"replicas"' in out  # /admin/backends
    assert "Model(id='fast'" in out  # openai models.retrieve
    assert "server.port:" in out
    assert "(file config/tiergate.sim.yaml)" in out
    assert "ok: private backends only" in out  # check-exposure


def test_demo_banner_shows_key_admin_token_and_simulation_notice(demo: DemoStack) -> None:
    """The demo prints its key, the admin token with /metrics and /admin/backends examples."""
    text = demo.text()
    key = (demo.state / "demo-key").read_text().strip()
    token = (demo.state / "admin-token").read_text().strip()
    assert f"export TIERGATE_KEY={key}" in text
    assert f"export TIERGATE_ADMIN_TOKEN={token}" in text
    assert "/metrics" in text
    assert "/admin/backends" in text
    assert ".parse() fail" in text
    assert oct((demo.state / "admin-token").stat().st_mode & 0o777) == "0o600"


def test_demo_keeps_its_key_across_restarts(tmp_path: Path) -> None:
    """A restarted demo shows the same key and admin token again, and the key still works."""
    state = tmp_path / "state"
    first = DemoStack(state).start()
    first.stop()
    key = (state / "demo-key").read_text().strip()
    token = (state / "admin-token").read_text().strip()
    again = DemoStack(state).start()
    try:
        assert "the same key as last time" in again.text()
        assert f"export TIERGATE_KEY={key}" in again.text()
        assert f"export TIERGATE_ADMIN_TOKEN={token}" in again.text()
        cwd = scratch_dir(tmp_path / "clone", {".demo": state})
        result = run_blocks(marked_blocks(REPO / "README.md")[:1], cwd=cwd, ports=again.ports)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "[simulated reply" in result.stdout
    finally:
        again.stop()
