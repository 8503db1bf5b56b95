"""/admin/routing names the live artifact; /admin/router/reload swaps it without a restart."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import router_models
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": "Bearer routing-admin-token-0000000000000"}


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fast_sim: SimulatorProcess
) -> Iterator[tuple[GatewayProcess, Path]]:
    """A gateway whose router artifact is a copy we can replace."""
    artifact = tmp_path_factory.mktemp("artifact") / "router.npz"
    shutil.copy(router_models.DEFAULT_ARTIFACT, artifact)
    config = {
        "auth": {"enabled": False, "admin_token": ADMIN["Authorization"][7:]},
        "tiers": tiers_config([fast_sim.url], [fast_sim.url]),
        "router": {"artifact": str(artifact)},
    }
    with GatewayProcess(config) as gw:
        yield gw, artifact


def test_routing_view_names_the_artifact_and_reload_swaps_it(
    gateway: tuple[GatewayProcess, Path],
) -> None:
    """A broken file is refused (the live artifact stays); a good one is loaded at once."""
    gw, artifact = gateway
    view = httpx.get(gw.url + "/admin/routing", headers=ADMIN).json()
    assert view["artifact"]["path"] == str(artifact)
    assert view["artifact"]["data_digest"]
    assert view["artifact"]["id"] == router_models.artifact_digest(artifact)
    first_loaded = view["artifact"]["loaded_at"]
    assert httpx.post(gw.url + "/admin/router/reload").status_code == 401
    good = artifact.read_bytes()
    artifact.write_bytes(b"not an artifact")
    bad = httpx.post(gw.url + "/admin/router/reload", headers=ADMIN)
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "artifact_invalid"
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
    artifact.write_bytes(good)
    ok = httpx.post(gw.url + "/admin/router/reload", headers=ADMIN)
    assert ok.status_code == 200
    assert ok.json()["artifact"]["loaded_at"] > first_loaded
