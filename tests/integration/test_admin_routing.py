"""/admin/routing names the live artifact; /admin/router/reload swaps it without a restart."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import router_models
from tests.integration.gateway_proc import GatewayProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": "Bearer routing-admin-token-0000000000000"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    """A gateway whose router artifact is a copy we can replace."""
    artifact = tmp_path_factory.mktemp("artifact") / "router.npz"
    shutil.copy(router_models.DEFAULT_ARTIFACT, artifact)

    def replaceable(config: dict[str, Any], _: Backends) -> None:
        config["auth"]["admin_token"] = ADMIN["Authorization"][7:]
        config["router"] = {"artifact": str(artifact)}

    with running_stack(sims=(FAST_SIM,), configure=replaceable) as stack:
        yield stack.gateway, artifact


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
