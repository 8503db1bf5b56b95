"""One real simulator (per backend variant) behind one real ``tiergate serve``, keys included."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.conformance.backends import BACKENDS, Backend
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess
from tests.simulator.procs import SimulatorProcess

ADMIN = "conformance-admin-token-0123456789abcdef"
UPSTREAM_KEY = "conformance-upstream-key-0123456789"
TIER_CAP = 300
MAX_MODEL_LEN = 2048


@dataclass
class Stack:
    """A running backend and gateway, and the keys to call it with."""

    backend: Backend
    sim: SimulatorProcess
    gateway: GatewayProcess
    key: str  # no limits
    capped_key: str  # max_tokens 256, 3,000 tokens a minute
    keys_file: Path

    def auth(self, key: str | None = None) -> dict[str, str]:
        """The Authorization header for ``key`` (default: the unlimited key)."""
        return {"Authorization": f"Bearer {key or self.key}"}

    def backends(self, gateway: GatewayProcess | None = None) -> dict[str, Any]:
        """``GET /admin/backends``."""
        gw = gateway or self.gateway
        resp = httpx.get(gw.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"})
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data

    def replica(self, gateway: GatewayProcess | None = None) -> dict[str, Any]:
        """The fast tier's only replica in the admin view."""
        view: dict[str, Any] = self.backends(gateway)["tiers"]["fast"]["replicas"][0]
        return view


def gateway_config(sim: SimulatorProcess, keys_file: Path, **tier_options: Any) -> dict[str, Any]:
    """Both tiers on ``sim``, keys from ``keys_file``, the upstream key unless overridden."""
    tier = {
        "model": "tiergate-fast",
        "replicas": [sim.url],
        "max_tokens_cap": TIER_CAP,
        "api_key": UPSTREAM_KEY,
        **tier_options,
    }
    return {
        "auth": {"keys_file": str(keys_file), "admin_token": ADMIN, "cache_ttl_s": 0},
        "health": {"interval_s": 0.2},
        "tiers": {"fast": dict(tier), "precise": dict(tier)},
    }


def _keys(path: Path) -> tuple[str, str]:
    store = FileKeyStore(path)
    now = time.time()
    record, key = issue_key("conformance", KeyPolicy(), now=now)
    store.put_sync(record)
    capped, capped_key = issue_key("capped", KeyPolicy(max_tokens=256, tpm=3000), now=now)
    store.put_sync(capped)
    return key, capped_key


@pytest.fixture(scope="module", params=BACKENDS, ids=lambda b: b.name)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A simulator of the variant (fast profile, real latencies) and a gateway in front,
    forked from a pre-imported fork server (tests/integration/forked_gateway.py): no scenario
    is about the gateway's start."""
    backend: Backend = request.param
    keys_file = tmp_path_factory.mktemp("conformance") / "keys.yaml"
    key, capped_key = _keys(keys_file)
    args = [
        *backend.sim_args,
        "--profile",
        "fast",
        "--model",
        "tiergate-fast",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enable-prompt-tokens-details",
    ]
    if backend.api_key:
        args += ["--api-key", UPSTREAM_KEY]
    with SimulatorProcess(*args) as sim, ForkedGateway(gateway_config(sim, keys_file)) as gw:
        yield Stack(backend, sim, gw, key, capped_key, keys_file)
