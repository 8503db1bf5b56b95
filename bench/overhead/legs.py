"""The gateway legs of the overhead benchmark: TierGate (per variant) and LiteLLM.

Each ``start_*`` function returns a running :class:`Leg` (or raises ``LegUnavailableError`` with a
message saying why the leg cannot run); ``Leg.stop`` ends everything it started.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.harness.legs import (
    REPO_ROOT,
    Leg,
    LegUnavailableError,
    Placement,
    install_into,
    probe_or_stop,
    start_fixed_upstream,
    start_redis,
    start_service,
)
from bench.harness.processes import Service, free_port
from bench.overhead.variants import Variant, gateway_config, gateway_env, key_create_command

LITELLM_VERSION = "1.108.0"  # never 1.82.7 / 1.82.8: those releases were compromised
LITELLM_MASTER_KEY = "sk-litellm-bench-master"
LITELLM_VENV = REPO_ROOT / "bench" / ".venv-litellm"


def create_key(workdir: Path, tiers: str | None = None) -> str:
    """A new benchmark API key (all tiers, or ``tiers``) in ``workdir``'s key file."""
    cmd = key_create_command(str(Path(sys.executable).with_name("tiergate")), workdir, tiers)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise LegUnavailableError(
            f"`{' '.join(cmd)}` failed ({proc.returncode}); the auth-enabled variants need it.\n"
            f"{proc.stderr.strip()[-1500:]}"
        )
    return lines[-1].strip()


def start_tiergate(
    variant: Variant,
    upstream: Leg,
    workdir: Path,
    pin: Placement,
    launcher: tuple[str, ...] = (),
    *,
    workers: int = 1,
    adjust: Callable[[dict[str, Any]], None] | None = None,
) -> Leg:
    """TierGate for one variant, pinned to the proxy core, in front of ``upstream``.

    ``launcher`` runs the gateway through another command (e.g. ``python -m cProfile -o F
    -m gateway``) instead of the ``tiergate`` script; ``adjust`` edits the generated config
    in place (the streams benchmark raises the tiers' concurrency).
    """
    extras: list[Service] = []
    try:
        redis_url = None
        if variant.needs_redis:
            redis = start_redis(workdir, pin)
            extras.append(redis)
            redis_url = f"redis://127.0.0.1:{redis.port}/0"
        sink_url = None
        if variant.trace_sample_ratio is not None:
            sink = start_fixed_upstream(workdir, pin, name="otlp-sink").main
            extras.append(sink)
            sink_url = f"http://127.0.0.1:{sink.port}"
        api_key = create_key(workdir) if variant.needs_key else None
        # The memory phase's 403s: a key that may use the fast tier only.
        other_keys = {"fast-only": create_key(workdir, tiers="fast")} if variant.needs_key else {}
        config = gateway_config(variant, upstream.base_url, upstream.model, workdir, redis_url)
        if adjust is not None:
            adjust(config)
        config_path = workdir / f"tiergate-{variant.name}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        tiergate = launcher or (str(Path(sys.executable).with_name("tiergate")),)
        cmd = [*pin.proxy, *tiergate, "serve", "--config", str(config_path)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
        env = gateway_env(variant, sink_url)
        service = start_service(
            Service("tiergate", cmd, port, workdir / "tiergate.log", env, pin.boosted),
            "/v1/models",
        )
    except LegUnavailableError:
        for extra in reversed(extras):
            extra.stop()
        raise
    leg = Leg(
        f"TierGate ({variant.name})" + (f", {workers} workers" if workers > 1 else ""),
        f"http://127.0.0.1:{port}",
        variant.request_model,
        api_key,
        service,
        extras,
        other_keys=other_keys,
    )
    return probe_or_stop(leg)


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
    proc = install_into(python, f"litellm[proxy]=={LITELLM_VERSION}")
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
    start_service(service, "/health/liveliness", timeout_s=120)
    leg = Leg(
        f"LiteLLM {LITELLM_VERSION}",
        f"http://127.0.0.1:{port}",
        upstream.model,
        LITELLM_MASTER_KEY,
        service,
    )
    return probe_or_stop(leg)
