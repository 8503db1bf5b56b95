"""Values a user may plausibly set never open the lockdown or leak a secret without a word.

Each value here was accepted by values.schema.json and rendered into an object that did what
the user did not mean: a secret in the gateway's ConfigMap, or a NetworkPolicy rule whose
empty peer list Kubernetes reads as "every source" / "every destination".
"""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest

from tests.deploy import chart_render
from tests.deploy.chart_render import CHART

SECRET = "SENTINEL-SECRET-IN-CONFIG"


def _schema_refuses(values: dict[str, Any], complaint: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match=complaint):
        chart.validate_schema(values)


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        (
            {
                "tiers": {
                    "fast": {"model": "m", "replicas": ["http://vllm-fast:8000"], "api_key": SECRET}
                }
            },
            "api_key",
        ),
        (
            {
                "tiers": {
                    "fast": {
                        "model": "m",
                        "replicas": ["http://vllm-fast:8000"],
                        "api_key": [SECRET, SECRET + "-2"],
                    }
                }
            },
            "api_key",
        ),
        ({"tiers": {"fast": {"model": "m", "replicas": []}}, "auth": {"pepper": SECRET}}, "pepper"),
    ],
)
def test_schema_refuses_every_secret_setting_in_the_config_map(
    config: dict[str, Any], complaint: str
) -> None:
    """A tier's upstream API key or the key-digest pepper in `config` is refused, not rendered."""
    _schema_refuses({"config": config}, complaint)


def test_no_secret_setting_of_the_gateway_is_left_open_in_the_schema() -> None:
    """Every secret-valued gateway setting (SecretStr or a token/pepper) is refused in `config`."""
    with (CHART / "values.schema.json").open(encoding="utf-8") as handle:
        schema = json.load(handle)
    config = schema["properties"]["config"]["properties"]
    tier = config["tiers"]["additionalProperties"]["properties"]
    refused = {
        "auth.admin_token": config["auth"]["properties"].get("admin_token"),
        "auth.pepper": config["auth"]["properties"].get("pepper"),
        "redis.url": config["redis"]["properties"].get("url"),
        "tiers.*.api_key": tier.get("api_key"),
    }
    assert {path: rule for path, rule in refused.items() if rule is None} == {}
    for path, rule in refused.items():
        assert rule.get("not") == {}, path


@pytest.mark.parametrize(
    "network_policy",
    [
        {"metricsFrom": []},
        {"externalVllm": {"peers": [], "ports": [8000]}},
        {"externalRedis": {"peers": [], "ports": [6379]}},
        {"otlp": {"peers": [], "ports": [4318]}},
        {"dns": {"peers": [], "ports": [53]}},
    ],
    ids=["metricsFrom", "externalVllm", "externalRedis", "otlp", "dns"],
)
def test_an_empty_peer_list_is_refused_not_read_as_everyone(
    network_policy: dict[str, Any],
) -> None:
    """`[]` peers would render `from: []` / `to: []`, which Kubernetes reads as any peer."""
    (name,) = network_policy
    _schema_refuses({"networkPolicy": network_policy}, name)


@pytest.mark.parametrize(
    "flag", ["--api-key", "--api-key=x", "--api-ke", "--api_key", "--api_key=x", "--api_k"]
)
def test_schema_refuses_a_vllm_api_key_in_extra_args(flag: str) -> None:
    """A key in vLLM's args shows in `kubectl describe`; vllm.apiKeySecret is the way. vLLM's
    parser (FlexibleArgumentParser) reads `_` in an option's name as `-`, so `--api_key` is
    the same option."""
    _schema_refuses(
        {"vllm": {"tiers": {"fast": {"enabled": True, "extraArgs": [flag, SECRET]}}}},
        "extraArgs",
    )


def test_turning_network_policies_off_warns_about_every_open_port() -> None:
    """networkPolicy.enabled false: NOTES names vLLM and metrics, and Redis as reachable (its
    password, from a Secret, is then all that guards it)."""
    notes = chart_render.render({"networkPolicy": {"enabled": False}})[
        "tiergate/templates/NOTES.txt"
    ]
    warning = " ".join(notes.split("networkPolicy.enabled is false", 1)[1].split())
    assert "vLLM" in warning
    assert "Redis" in warning
    assert "no password" not in warning
    assert "password" in warning
    assert "metrics port" in warning
    quiet = chart_render.render({"networkPolicy": {"enabled": False}, "redis": {"enabled": False}})
    assert "Redis" not in quiet["tiergate/templates/NOTES.txt"].split("is false", 1)[1]
