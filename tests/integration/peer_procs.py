"""Other OpenAI-compatible layers as real processes, for a tier to point at: a LiteLLM proxy and
vllm-router (Rust), each in front of simulator processes.

    with litellm_proxy([sim.url], "tiergate-fast", MASTER_KEY) as url: ...
    with vllm_router([sim.url]) as url: ...

Both are installed by the benchmarks' own installers (``bench/overhead/legs.py``'s
``ensure_litellm``: LiteLLM 1.108.0 in ``bench/.venv-litellm``; ``bench/overhead/peers.py``'s
``ensure_vllm_router``: vllm-router 0.1.17 in ``bench/.peers/vllm-router``), pinned and cached:
the first run installs from PyPI (a minute or two), later runs reuse them. When the package
cannot be installed (no network, no wheel for the platform) the test is skipped, saying why.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from bench.harness.legs import LegUnavailableError
from bench.overhead.legs import LITELLM_VERSION, ensure_litellm
from bench.overhead.peers import VLLM_ROUTER_VERSION, ensure_vllm_router
from tests.processes import free_port, http_answers, terminate, wait_ready


def litellm_command() -> Path:
    """The pinned ``litellm`` command, installed on first use; skips the test if it cannot be."""
    try:
        return ensure_litellm()
    except (LegUnavailableError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"LiteLLM {LITELLM_VERSION} could not be installed from PyPI: {exc}")


def vllm_router_command() -> Path:
    """The pinned ``vllm-router`` command, installed on first use; skips the test if it cannot
    be."""
    try:
        return ensure_vllm_router().command
    except (LegUnavailableError, OSError) as exc:
        pytest.skip(f"vllm-router {VLLM_ROUTER_VERSION} could not be installed from PyPI: {exc}")


@contextmanager
def _running(
    command: list[str],
    ready_url: str,
    what: str,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Iterator[Path]:
    """Run ``command`` until the block ends; wait until ``ready_url`` answers; yield its log."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / f"{what}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        try:
            wait_ready(
                proc,
                lambda: http_answers(ready_url),
                timeout=timeout,
                poll_s=0.2,
                what=what,
                log=lambda: log_path.read_text(errors="replace")[-3000:],
            )
            yield log_path
        finally:
            terminate(proc)


@contextmanager
def litellm_proxy(upstreams: list[str], model: str, master_key: str) -> Iterator[str]:
    """A LiteLLM proxy (one worker, no database) serving ``model`` from ``upstreams`` (one
    deployment each, as ``openai/<model>``), ``master_key`` its key; its base URL."""
    command = litellm_command()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "litellm.yaml"
        deployments = [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": url + "/v1",
                    "api_key": "sk-simulator-ignores-it",
                },
            }
            for url in upstreams
        ]
        config.write_text(
            yaml.safe_dump(
                {
                    "model_list": deployments,
                    "litellm_settings": {"telemetry": False, "set_verbose": False},
                    "general_settings": {"master_key": master_key, "disable_spend_logs": True},
                }
            )
        )
        port = free_port()
        # Without PYTHONDONTWRITEBYTECODE (set on the build machine): the first start writes the
        # .pyc of the 3,800 modules LiteLLM imports into its cached virtualenv, which its
        # installer leaves uncompiled; each later start (another xdist worker that took some of
        # these tests, the next run) skips compiling them: importing the proxy took 16 s of CPU
        # without them, 8-10 s with them (2-core machine at load 9-10, 2026-12-07).
        inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env = {
            **inherited,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch at start-up
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOG": "ERROR",
            "LITELLM_MODE": "PRODUCTION",
        }
        argv = [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                "--num_workers", "1"]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with _running(argv, url + "/health/liveliness", "litellm", env, timeout=120):
            yield url


@contextmanager
def vllm_router(workers: list[str], *options: str) -> Iterator[str]:
    """vllm-router (``round_robin``) in front of ``workers``; extra CLI ``options``; its URL.
    Its Prometheus exporter gets a free port of its own (the default, 29000, is one per host)."""
    command = vllm_router_command()
    port = free_port()
    options = ("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *options)
    argv = [str(command), "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--log-level", "warning", *options, "--worker-urls", *workers]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with _running(argv, url + "/health", "vllm-router", timeout=90):
        yield url
