"""What every benchmark leg is made of: a running server (:class:`Leg`), where processes run
(:class:`Placement`), and the servers every benchmark shares (the fixed upstream, the
simulator, Redis).

Each ``start_*`` function returns a running server (or raises ``LegUnavailableError`` with a
message saying why it cannot run); ``Leg.stop`` ends everything a leg started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.processes import Service, free_port, http_answers, post_json, redis_answers

UPSTREAM_MODEL = "tiergate-fast"
CHAT_PATH = "/v1/chat/completions"
REPO_ROOT = Path(__file__).resolve().parents[2]


def install_into(python: Path, requirement: str) -> subprocess.CompletedProcess[str]:
    """Install ``requirement`` into the virtualenv of ``python``: with the repository's pinned
    uv when ``make install`` put it there (its cache makes a fresh clone's install seconds, not
    minutes), else with that virtualenv's pip."""
    uv = REPO_ROOT / ".tools" / "bin" / "uv"
    if uv.exists():
        command = [str(uv), "pip", "install", "-q", "--python", str(python), requirement]
    else:
        command = [str(python), "-m", "pip", "install", "-q", requirement]
    return subprocess.run(command, capture_output=True, text=True, check=False)


class LegUnavailableError(RuntimeError):
    """A leg cannot run here (missing command, failed start); the message says why."""


@dataclass
class Leg:
    """A proxy or upstream under test: where to send requests and what it is running."""

    name: str
    base_url: str
    model: str
    api_key: str | None
    main: Service
    extras: list[Service] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    other_keys: dict[str, str] = field(default_factory=dict)  # keys with other policies, by role
    chat_path: str = CHAT_PATH

    @property
    def chat_url(self) -> str:
        """The chat completions endpoint."""
        return self.base_url + self.chat_path

    def body(self) -> dict[str, object]:
        """The small non-streaming chat completion every point POSTs."""
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
        }

    def probe(self, timeout_s: float = 30.0) -> None:
        """POST one request until it answers 200 with a chat completion, else raise."""
        deadline = time.monotonic() + timeout_s
        status, payload = 0, b""
        while time.monotonic() < deadline:
            status, payload = post_json(
                self.chat_url, json.dumps(self.body()).encode(), self.api_key, self.headers
            )
            if status == 200 and b'"choices"' in payload:
                return
            time.sleep(0.5)
        raise LegUnavailableError(
            f"probe POST {self.chat_url} answered {status}: {payload[:500]!r}\n"
            f"--- log tail ---\n{self.main.log_tail()}"
        )

    def sessions(self) -> list[int]:
        """Session ids of every process this leg started (each service leads its own session)."""
        return [s.proc.pid for s in (self.main, *self.extras) if s.proc is not None]

    def stop(self) -> None:
        """Stop the main process, then what it depends on."""
        self.main.stop()
        for service in reversed(self.extras):
            service.stop()


@dataclass(frozen=True)
class Placement:
    """Command prefixes: the proxy alone on CPU 0, load + upstream on CPU 1, high priority."""

    proxy: tuple[str, ...]
    load: tuple[str, ...]

    @classmethod
    def build(cls, pin: bool, boost: bool) -> Placement:
        """Pin with taskset (on 2+ CPUs) and, as root, run at nice -20.

        Nice -20 gives the benchmark's processes ~99 % of the CPU against nice-0 work, so
        builds or test runs elsewhere on a shared machine barely move the numbers.
        """
        nice: tuple[str, ...] = ("nice", "-n", "-20") if boost and os.geteuid() == 0 else ()
        if not pin or (os.cpu_count() or 1) < 2:
            return cls(nice, nice)
        return cls((*nice, "taskset", "-c", "0"), (*nice, "taskset", "-c", "1"))

    @property
    def boosted(self) -> bool:
        """Whether the prefixes raise priority."""
        return "nice" in self.proxy


def start_service(service: Service, ready_path: str, timeout_s: float = 60.0) -> Service:
    """Start ``service`` and wait until ``ready_path`` answers; ``LegUnavailableError`` if not."""
    try:
        service.start(http_answers(f"http://127.0.0.1:{service.port}{ready_path}"), timeout_s)
    except (RuntimeError, OSError) as exc:
        raise LegUnavailableError(f"{service.name}: {exc}") from exc
    return service


def probe_or_stop(leg: Leg) -> Leg:
    """Probe ``leg``; stop it and re-raise when it does not answer a chat completion."""
    try:
        leg.probe()
    except LegUnavailableError:
        leg.stop()
        raise
    return leg


def start_fixed_upstream(workdir: Path, pin: Placement, name: str = "fixed-upstream") -> Leg:
    """The raw uvloop+httptools fixed-response upstream, pinned to the load core."""
    port = free_port()
    script = Path(__file__).with_name("fixed_upstream.py")
    cmd = [*pin.load, sys.executable, str(script), "--port", str(port), "--model", UPSTREAM_MODEL]
    service = start_service(
        Service(name, cmd, port, workdir / f"{name}.log", boost=pin.boosted), "/health"
    )
    return Leg("fixed upstream (direct)", f"http://127.0.0.1:{port}", UPSTREAM_MODEL, None, service)


def start_simulator(workdir: Path, pin: Placement) -> Leg:
    """TierGate's vLLM simulator at zero latency, pinned to the load core."""
    port = free_port()
    cmd = [
        *pin.load,
        sys.executable,
        "-m",
        "simulator",
        "--port",
        str(port),
        "--profile",
        "fast",
        "--model",
        UPSTREAM_MODEL,
        "--latency-scale",
        "0",
    ]
    service = start_service(
        Service("simulator", cmd, port, workdir / "simulator.log", boost=pin.boosted), "/health"
    )
    return Leg(
        "simulator, latency 0 (direct)", f"http://127.0.0.1:{port}", UPSTREAM_MODEL, None, service
    )


def start_redis(workdir: Path, pin: Placement) -> Service:
    """A private ``redis-server`` on a free port, no persistence, pinned to the load core."""
    port = free_port()
    cmd = [
        *pin.load,
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    service = Service("redis", cmd, port, workdir / "redis.log", boost=pin.boosted)
    try:
        service.start(redis_answers(port), timeout_s=20)
    except (RuntimeError, FileNotFoundError) as exc:
        raise LegUnavailableError(f"redis-server could not start: {exc}") from exc
    return service
