"""docs/api.md "Errors": malformed, non-object and empty bodies are all 400 ``invalid_json``.

Checked over real HTTP against ``tiergate serve`` (the natively served endpoints, trailing
slash included) and through Litestar's test client (the framework layer), on both inference
routes. The body is refused before any backend is chosen, so the replicas need not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from gateway.composition import create_app
from gateway.config.settings import Settings
from tests.integration.gateway_proc import GatewayProcess, tiers_config

pytestmark = pytest.mark.slow

CONFIG: dict[str, Any] = {
    "auth": {"enabled": False},
    "tiers": tiers_config(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]),
}
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions/", "/v1/completions/"]
BODIES = [b'{"model":', b"[1]", b'"str"', b"null", b"", b"1", b"true", b"[]", b"  "]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayProcess]:
    """A gateway, auth off, whose replicas are never reached."""
    with GatewayProcess(CONFIG) as process:
        yield process


@pytest.fixture(scope="module")
def framework() -> Iterator[TestClient[Any]]:
    """The same settings served by the Litestar app in process."""
    with TestClient(app=create_app(Settings.model_validate(CONFIG))) as client:
        yield client


def _assert_invalid_json(resp: httpx.Response) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_json", error
    assert error["param"] is None
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("body", BODIES)
def test_a_body_that_is_not_a_json_object_is_invalid_json_over_http(
    gw: GatewayProcess, path: str, body: bytes
) -> None:
    """The served endpoints answer 400 ``invalid_json`` with no param for each such body."""
    headers = {"content-type": "application/json"}
    _assert_invalid_json(httpx.post(gw.url + path, content=body, headers=headers, timeout=10))


@pytest.mark.parametrize("path", PATHS[:2])
@pytest.mark.parametrize("body", BODIES)
def test_a_body_that_is_not_a_json_object_is_invalid_json_in_the_framework(
    framework: TestClient[Any], path: str, body: bytes
) -> None:
    """The Litestar layer gives the same 400 ``invalid_json`` for each such body."""
    headers = {"content-type": "application/json"}
    _assert_invalid_json(framework.post(path, content=body, headers=headers))
