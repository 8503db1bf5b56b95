"""The start-up exposure check on the shipped configurations, with real name resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config.exposure import (
    check_exposure,
    format_finding,
    metrics_listen_host,
    refuses_start,
    resolve_host,
)
from gateway.config.settings import Settings, load_settings
from tests.deploy.chart_render import of_kind
from tests.deploy.compose_file import REPO, environment_of, interpolate

SIM_CONFIG = REPO / "config" / "tiergate.sim.yaml"
GPU_CONFIG = REPO / "deploy" / "compose" / "tiergate.gpu.yaml"
POD_IP = "10.244.3.17"  # what status.podIP gives the chart's TIERGATE_TELEMETRY__METRICS_HOST


def _findings(settings: Settings) -> list[str]:
    uses_redis = settings.ratelimit.backend == "redis" or settings.auth.store == "redis"
    findings = check_exposure(
        bind_host=settings.server.host,
        tls_in_front=settings.server.tls_terminated_upstream,
        backends={name: tier.replicas for name, tier in settings.tiers.items()},
        redis_url=settings.redis.url if uses_redis else None,
        metrics_host=metrics_listen_host(settings),
    )
    return [f.code for f in findings]


def _compose_env(monkeypatch: pytest.MonkeyPatch, compose: dict[str, Any], service: str) -> None:
    """Set the environment compose gives ``service`` (variables at their defaults)."""
    for key, value in environment_of(compose["services"][service]).items():
        if value is not None:
            monkeypatch.setenv(key, interpolate(value))


def test_resolver_answers_from_the_system() -> None:
    """localhost resolves to a loopback address; a reserved .invalid name resolves to nothing."""
    assert set(resolve_host("localhost")) & {"127.0.0.1", "::1"}
    assert resolve_host("tiergate-check.invalid") == []


def test_unresolvable_dns_backend_warns_through_the_real_resolver() -> None:
    """A DNS name the system cannot resolve is reported as unknown, as a warning."""
    findings = check_exposure(
        bind_host="127.0.0.1",
        tls_in_front=False,
        backends={"fast": ["http://gpu-box.tiergate-check.invalid:8000"]},
    )
    assert [f.code for f in findings] == ["upstream_unresolved"]
    assert not refuses_start(findings, "strict")
    assert format_finding(findings[0]).startswith("warning: tiers.fast.replicas[0]: ")


def test_make_demo_configuration_has_no_exposure() -> None:
    """`make demo` (loopback gateway, loopback simulators) passes the check with no finding."""
    assert _findings(load_settings(SIM_CONFIG)) == []


def test_compose_sim_gateway_only_notes_its_container_bind(
    monkeypatch: pytest.MonkeyPatch, compose: dict[str, Any]
) -> None:
    """In compose's sim profile only the in-container 0.0.0.0 bind is reported."""
    _compose_env(monkeypatch, compose, "gateway-sim")
    settings = load_settings(SIM_CONFIG, server__host="0.0.0.0")
    assert settings.tiers["fast"].replicas == ["http://sim-fast:8101"]
    assert settings.auth.keys_file == Path("/run/secrets/tiergate_keys")
    assert settings.ratelimit.backend == "redis"
    assert _findings(settings) == ["bind_all_interfaces"]


def test_compose_gpu_gateway_configuration_loads_and_keeps_backends_private(
    monkeypatch: pytest.MonkeyPatch, compose: dict[str, Any]
) -> None:
    """The GPU profile's config is valid settings whose backends and Redis are private."""
    _compose_env(monkeypatch, compose, "gateway")
    settings = load_settings(GPU_CONFIG, server__host="0.0.0.0")
    assert settings.tiers["fast"].model == "tiergate-fast"
    assert settings.telemetry.metrics_port == 9464
    assert settings.telemetry.metrics_host == "172.30.94.10"  # its telemetry-network address
    assert _findings(settings) == ["bind_all_interfaces"]


def _chart_settings(tmp_path: Path, objects: list[dict[str, Any]]) -> Settings:
    (config_map,) = [c for c in of_kind(objects, "ConfigMap") if "tiergate.yaml" in c["data"]]
    path = tmp_path / "tiergate.yaml"
    path.write_text(config_map["data"]["tiergate.yaml"], encoding="utf-8")
    # The Deployment passes --host 0.0.0.0 and sets the metrics host to the pod's IP.
    return load_settings(path, server__host="0.0.0.0", telemetry__metrics_host=POD_IP)


def test_chart_with_tls_ingress_passes_strict_mode(
    tmp_path: Path, everything_objects: list[dict[str, Any]]
) -> None:
    """The everything-on chart (TLS Ingress, in-cluster vLLM and Redis) starts in strict mode."""
    settings = _chart_settings(tmp_path, everything_objects)
    assert settings.exposure.mode == "strict"
    assert settings.server.tls_terminated_upstream is True
    assert settings.telemetry.metrics_port == 9464
    assert _findings(settings) == []


def test_chart_metrics_port_on_every_interface_would_fail_strict_mode(
    tmp_path: Path, everything_objects: list[dict[str, Any]]
) -> None:
    """Without the pod-IP metrics host, the TLS Ingress would not cover metrics on 0.0.0.0."""
    settings = _chart_settings(tmp_path, everything_objects)
    exposed = settings.model_copy(
        update={"telemetry": settings.telemetry.model_copy(update={"metrics_host": None})}
    )
    assert _findings(exposed) == ["metrics_bind_all_interfaces"]
    assert refuses_start(
        check_exposure(
            bind_host="0.0.0.0",
            tls_in_front=True,
            backends={},
            metrics_host=metrics_listen_host(exposed),
        ),
        "strict",
    )


def test_chart_defaults_load_and_only_note_the_pod_bind(
    tmp_path: Path, default_objects: list[dict[str, Any]]
) -> None:
    """The default chart's config is valid settings; without TLS in front the bind is noted."""
    settings = _chart_settings(tmp_path, default_objects)
    assert settings.exposure.mode == "warn"
    assert _findings(settings) == ["bind_all_interfaces"]
