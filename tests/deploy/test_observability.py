"""The Grafana dashboard, Prometheus and the OTel collector fit the gateway and each other."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.config.settings import Settings
from gateway.limits.usage import MemoryUsageStore, UsageCollector, UsageLedger
from gateway.routing.accounting import cost_model
from gateway.routing.admin_routing import ShadowCollector
from gateway.routing.shadow import ShadowConfig, ShadowRunner
from gateway.telemetry.metrics import GatewayMetrics
from tests.deploy.compose_file import REPO, environment_of, interpolate, networks_of

DEPLOY = REPO / "deploy"
DASHBOARD = json.loads((DEPLOY / "grafana" / "dashboards" / "tiergate.json").read_text("utf-8"))
SERIES = re.compile(r"\b(tiergate_[a-z_]+)\b")
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count"),
}


def _yaml(*parts: str) -> dict[str, Any]:
    data = yaml.safe_load(DEPLOY.joinpath(*parts).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _exported_series() -> set[str]:
    """Every series name the gateway's real metrics registry exports."""
    registry = CollectorRegistry()
    GatewayMetrics(registry, {}, precise_tier="precise", target_share=0.3)
    settings = Settings()
    costs = cost_model(settings.tiers, settings.router.precise_tier)
    ledger = UsageLedger(costs, MemoryUsageStore())
    ledger.per_tier["fast"] = [1.0, 1.0, 1.0, 0.25, 1.0]
    registry.register(UsageCollector(ledger))
    shadow = ShadowRunner(
        ShadowConfig(fast_ratio=1.0),
        {},
        fast_tier="fast",
        precise_tier="precise",
        upstream=lambda: None,
    )
    shadow.record("fast_on_precise", "precise", "yes", "yes", 0.2, prompt="p")
    registry.register(ShadowCollector(shadow))
    return {
        family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]
    }


def _panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def _queried_series() -> set[str]:
    return {name for p in _panels() for t in p["targets"] for name in SERIES.findall(t["expr"])}


def test_dashboard_queries_only_series_the_gateway_exports() -> None:
    """Every tiergate_* series in a panel query exists in the gateway's metrics registry."""
    queried = _queried_series()
    assert queried
    assert queried <= _exported_series(), queried - _exported_series()


@pytest.mark.parametrize(
    "series",
    [
        "tiergate_requests_total",
        "tiergate_request_duration_seconds_bucket",
        "tiergate_time_to_first_token_seconds_bucket",
        "tiergate_precise_share",
        "tiergate_precise_share_target",
        "tiergate_overhead_seconds_bucket",
        "tiergate_upstream_retries_total",
        "tiergate_replica_healthy",
        "tiergate_cost_total",
        "tiergate_cost_baseline_total",
        "tiergate_shadow_cost_total",
        "tiergate_shadow_agreement_sum",
    ],
)
def test_dashboard_covers_the_required_views(series: str) -> None:
    """Requests, latency, share vs target, overhead, retries, health, savings, quality."""
    assert series in _queried_series()


def test_dashboard_panels_use_the_datasource_variable_and_fit_the_grid() -> None:
    """Panels query through ${datasource}, have unique ids and stay inside 24 columns."""
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert {"datasource", "tier"} <= variables
    for panel in _panels():
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24


@pytest.mark.parametrize("gateway", ["gateway", "gateway-sim"])
def test_the_metrics_port_listens_only_on_the_telemetry_network(
    compose: dict[str, Any], gateway: str
) -> None:
    """The gateway's metrics listener binds its fixed address on the telemetry network only,
    so the backends (inference), Redis (state) and the edge network cannot reach it."""
    service = compose["services"][gateway]
    host = interpolate(environment_of(service)["TIERGATE_TELEMETRY__METRICS_HOST"])
    address = interpolate(service["networks"]["telemetry"]["ipv4_address"])
    assert host == address
    (subnet,) = [c["subnet"] for c in compose["networks"]["telemetry"]["ipam"]["config"]]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(interpolate(subnet))
    assert compose["networks"]["telemetry"]["internal"] is True
    for other in ("edge", "inference", "state"):
        assert "ipv4_address" not in (service["networks"][other] or {})


def test_prometheus_scrapes_the_gateway_metrics_port(compose: dict[str, Any]) -> None:
    """Prometheus scrapes gateway:9464, the alias and metrics port both gateways use."""
    prometheus = _yaml("prometheus", "prometheus.yml")
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for s in job["static_configs"]
        for t in s["targets"]
    ]
    assert targets == ["gateway:9464"]
    gpu_config = yaml.safe_load((DEPLOY / "compose" / "tiergate.gpu.yaml").read_text("utf-8"))
    assert gpu_config["telemetry"]["metrics_port"] == 9464
    assert environment_of(compose["services"]["gateway-sim"])["TIERGATE_METRICS_PORT"] == "9464"
    for gateway in ("gateway", "gateway-sim"):
        assert compose["services"][gateway]["networks"]["telemetry"]["aliases"] == ["gateway"]
    assert "telemetry" in networks_of(compose["services"]["prometheus"])


def test_grafana_provisioning_matches_the_compose_mounts(compose: dict[str, Any]) -> None:
    """Grafana loads the dashboard directory compose mounts, from the Prometheus service."""
    grafana = compose["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    provider = _yaml("grafana", "provisioning", "dashboards", "tiergate.yaml")["providers"][0]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    sources = {
        s["type"]: s
        for s in _yaml("grafana", "provisioning", "datasources", "tiergate.yaml")["datasources"]
    }
    assert sources["prometheus"]["url"] == "http://prometheus:9090"
    assert sources["jaeger"]["url"] == "http://jaeger:16686"
    assert (
        environment_of(grafana)["GF_SECURITY_ADMIN_PASSWORD__FILE"]
        == "/run/secrets/grafana_admin_password"
    )


def test_traces_flow_gateway_to_collector_to_jaeger(compose: dict[str, Any]) -> None:
    """The gateway's OTLP endpoint is the collector's receiver, which exports to Jaeger."""
    collector = _yaml("otel-collector", "config.yaml")
    receiver_port = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[
        1
    ]
    for gateway in ("gateway", "gateway-sim"):
        endpoint = environment_of(compose["services"][gateway])["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert endpoint == f"http://otel-collector:{receiver_port}"
    pipeline = collector["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    (exporter,) = pipeline["exporters"]
    assert collector["exporters"][exporter]["endpoint"] == "jaeger:4317"
    shared = set(networks_of(compose["services"]["otel-collector"])) & set(
        networks_of(compose["services"]["jaeger"])
    )
    assert shared == {"telemetry"}
    assert networks_of(compose["services"]["otel-collector"]) == ["telemetry"]
