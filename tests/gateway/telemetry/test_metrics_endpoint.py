"""GET /metrics: behind the admin token on the main port, or alone on its own port."""

from __future__ import annotations

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client import CollectorRegistry, Counter

from gateway.composition import create_app
from gateway.config.settings import Settings
from gateway.pipeline.errors import EXCEPTION_HANDLERS
from gateway.telemetry.metrics_endpoint import metrics_handler
from tests.gateway.telemetry.served import ServedApp
from tests.processes import free_port

TOKEN = "admin-token-for-tests"


def _settings(**telemetry: object) -> Settings:
    dead = f"http://127.0.0.1:{free_port()}"
    return Settings.model_validate(
        {
            "auth": {"enabled": False, "admin_token": TOKEN},
            "tiers": {
                "fast": {"model": "m-fast", "replicas": [dead]},
                "precise": {"model": "m-precise", "replicas": [dead]},
            },
            "telemetry": telemetry,
        }
    )


def _client(admin_token: str | None, *, open_access: bool) -> TestClient[Litestar]:
    registry = CollectorRegistry()
    Counter("tiergate_example", "an example", registry=registry).inc()
    app = Litestar(
        [metrics_handler(registry, admin_token, open_access=open_access)],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    return TestClient(app)


def test_main_port_metrics_need_the_admin_token() -> None:
    """No or wrong bearer token: 401; the admin token: Prometheus text."""
    with _client(TOKEN, open_access=False) as client:
        assert client.get("/metrics").status_code == 401
        wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "invalid_request_error"
        ok = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert ok.headers["content-type"].startswith("text/plain")
        assert "tiergate_example_total 1.0" in ok.text


def test_without_an_admin_token_metrics_are_closed_unless_auth_is_off() -> None:
    """With auth on and no admin token, /metrics refuses; in auth-off development it is open."""
    with _client(None, open_access=False) as client:
        assert client.get("/metrics").status_code == 403
    with _client(None, open_access=True) as client:
        assert client.get("/metrics").status_code == 200


def test_the_app_serves_its_own_registry_on_the_main_port() -> None:
    """create_app mounts /metrics with the gateway's metric names behind the admin token."""
    with ServedApp(create_app(_settings())) as served:
        denied = httpx.get(served.url + "/metrics", timeout=5)
        page = httpx.get(
            served.url + "/metrics", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert denied.status_code == 401
    assert page.status_code == 200
    for name in (
        "tiergate_replica_healthy",
        "tiergate_replica_in_flight",
        "tiergate_precise_share_target",
        "tiergate_overhead_seconds",
    ):
        assert name in page.text


def test_a_metrics_port_moves_metrics_off_the_main_port() -> None:
    """With telemetry.metrics_port the main port has no /metrics and the other port serves it."""
    port = free_port()
    with ServedApp(create_app(_settings(metrics_port=port))) as served:
        main = httpx.get(
            served.url + "/metrics", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        side = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert main.status_code == 404
    assert side.status_code == 200
    assert "tiergate_replica_healthy" in side.text


def test_metrics_host_binds_the_metrics_port_to_that_address_only() -> None:
    """With telemetry.metrics_host the metrics port answers there and on no other address."""
    port = free_port()
    settings = _settings(metrics_port=port, metrics_host="127.0.0.2")
    with ServedApp(create_app(settings)):
        there = httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert there.status_code == 200


def test_the_metrics_port_binds_server_host_when_metrics_host_is_unset() -> None:
    """docs/observability.md: metrics_host is by default server.host."""
    port = free_port()
    settings = _settings(metrics_port=port)
    settings.server.host = "127.0.0.2"
    with ServedApp(create_app(settings)):
        there = httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert there.status_code == 200
