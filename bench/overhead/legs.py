"""The servers of each benchmark leg: upstreams, TierGate (per variant) and LiteLLM.

Each ``start_*`` function returns a running :class:`Leg` (or raises ``LegUnavailableError`` with a
message saying why the leg cannot run); ``Leg.stop`` ends everything it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.overhead.processes import (
    Service,
    free_port,
    http_answers,
    post_json,
    redis_answers,
)
from bench.overhead.variants import Variant, gateway_config, gateway_env, key_create_command

UPSTREAM_MODEL = "tiergate-fast"
CHAT_PATH = "/v1/chat/completions"
LITELLM_VERSION = "1.108.0"  # never 1.82.7 / 1.82.8: those releases were compromised
LITELLM_MASTER_KEY = "sk-litellm-bench-master"
REPO_ROOT = Path(__file__).resolve().parents[2]
LITELLM_VENV = REPO_ROOT / "bench" / ".venv-litellm"


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

    @property
    def chat_url(self) -> str:
        """The chat completions endpoint."""
        return self.base_url + CHAT_PATH

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
                self.chat_url, json.dumps(self.body()).encode(), self.api_key
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


def _start(service: Service, ready_path: str, timeout_s: float = 60.0) -> Service:
    try:
        service.start(http_answers(f"http://127.0.0.1:{service.port}{ready_path}"), timeout_s)
    except (RuntimeError, OSError) as exc:
        raise LegUnavailableError(f"{service.name}: {exc}") from exc
    return service


def start_fixed_upstream(workdir: Path, pin: Placement, name: str = "fixed-upstream") -> Leg:
    """The raw uvloop+httptools fixed-response upstream, pinned to the load core."""
    port = free_port()
    script = Path(__file__).with_name("fixed_upstream.py")
    cmd = [*pin.load, sys.executable, str(script), "--port", str(port), "--model", UPSTREAM_MODEL]
    service = _start(
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
    service = _start(
        Service("simulator", cmd, port, workdir / "simulator.log", boost=pin.boosted), "/health"
    )
    return Leg(
        "simulator, latency 0 (direct)", f"http://127.0.0.1:{port}", UPSTREAM_MODEL, None, service
    )


def _start_redis(workdir: Path, pin: Placement) -> Service:
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


def _create_key(workdir: Path) -> str:
    cmd = key_create_command(str(Path(sys.executable).with_name("tiergate")), workdir)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise LegUnavailableError(
            f"`{' '.join(cmd)}` failed ({proc.returncode}); the auth-enabled variants need it.\n"
            f"{proc.stderr.strip()[-1500:]}"
        )
    return lines[-1].strip()


def start_tiergate(variant: Variant, upstream: Leg, workdir: Path, pin: Placement) -> Leg:
    """TierGate for one variant, pinned to the proxy core, in front of ``upstream``."""
    extras: list[Service] = []
    try:
        redis_url = None
        if variant.needs_redis:
            redis = _start_redis(workdir, pin)
            extras.append(redis)
            redis_url = f"redis://127.0.0.1:{redis.port}/0"
        sink_url = None
        if variant.trace_sample_ratio is not None:
            sink = start_fixed_upstream(workdir, pin, name="otlp-sink").main
            extras.append(sink)
            sink_url = f"http://127.0.0.1:{sink.port}"
        api_key = _create_key(workdir) if variant.needs_key else None
        config = gateway_config(variant, upstream.base_url, upstream.model, workdir, redis_url)
        config_path = workdir / f"tiergate-{variant.name}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        tiergate = str(Path(sys.executable).with_name("tiergate"))
        cmd = [*pin.proxy, tiergate, "serve", "--config", str(config_path)]
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
        env = gateway_env(variant, sink_url)
        service = _start(
            Service("tiergate", cmd, port, workdir / "tiergate.log", env, pin.boosted),
            "/v1/models",
        )
    except LegUnavailableError:
        for extra in reversed(extras):
            extra.stop()
        raise
    leg = Leg(
        f"TierGate ({variant.name})",
        f"http://127.0.0.1:{port}",
        variant.request_model,
        api_key,
        service,
        extras,
    )
    _probe_or_stop(leg)
    return leg


def _probe_or_stop(leg: Leg) -> None:
    try:
        leg.probe()
    except LegUnavailableError:
        leg.stop()
        raise


def ensure_litellm() -> Path:
    """The cached LiteLLM virtualenv's ``litellm`` command, created on first use."""
    litellm = LITELLM_VENV / "bin" / "litellm"
    python = LITELLM_VENV / "bin" / "python"
    if litellm.exists():
        check = [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"]
        found = subprocess.run(check, capture_output=True, text=True, check=False).stdout.strip()
        if found == LITELLM_VERSION:
            return litellm
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} ...", flush=True)
    subprocess.run(["python3", "-m", "venv", str(LITELLM_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"]
    proc = subprocess.run(pip, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not litellm.exists():
        raise LegUnavailableError(f"pip install litellm[proxy] failed:\n{proc.stderr[-2000:]}")
    return litellm


def litellm_config(upstream: Leg) -> dict[str, object]:
    """LiteLLM proxy config: one OpenAI-compatible model on the upstream, master key, no extras."""
    return {
        "model_list": [
            {
                "model_name": upstream.model,
                "litellm_params": {
                    "model": f"openai/{upstream.model}",
                    "api_base": upstream.base_url + "/v1",
                    "api_key": "sk-upstream-unused",
                },
            }
        ],
        "litellm_settings": {
            "telemetry": False,
            "success_callback": [],
            "failure_callback": [],
            "callbacks": [],
            "set_verbose": False,
        },
        "general_settings": {"master_key": LITELLM_MASTER_KEY, "disable_spend_logs": True},
    }


def start_litellm(upstream: Leg, workdir: Path, pin: Placement) -> Leg:
    """LiteLLM proxy, one worker, pinned to the proxy core, in front of ``upstream``."""
    litellm = ensure_litellm()
    config_path = workdir / "litellm.yaml"
    config_path.write_text(yaml.safe_dump(litellm_config(upstream), sort_keys=False))
    port = free_port()
    cmd = [*pin.proxy, str(litellm), "--config", str(config_path)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch of the cost map at start-up
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "LITELLM_MODE": "PRODUCTION",  # as its production checklist recommends
    }
    service = Service("litellm", cmd, port, workdir / "litellm.log", env, pin.boosted)
    _start(service, "/health/liveliness", timeout_s=120)
    leg = Leg(
        f"LiteLLM {LITELLM_VERSION}",
        f"http://127.0.0.1:{port}",
        upstream.model,
        LITELLM_MASTER_KEY,
        service,
    )
    _probe_or_stop(leg)
    return leg
