"""The chart's Ingress publishes the inference API (`/v1`) and nothing else unless asked.

Before: `ingress.enabled: true` with the default hosts published `/`, so `/admin/*` (guarded
only by the admin token) and the unauthenticated `/readyz` answered from outside the cluster.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.deploy import chart_render
from tests.deploy.chart_render import of_kind


def _paths(values: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(path, pathType, backend port name) of every rule of the rendered Ingress."""
    (ingress,) = of_kind(chart_render.objects(chart_render.render(values)), "Ingress")
    return [
        (path["path"], path["pathType"], path["backend"]["service"]["port"]["name"])
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]


def _api_only(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def test_the_default_ingress_publishes_only_the_inference_api() -> None:
    """Switched on with its default hosts, the Ingress routes `/v1` (Prefix) to the HTTP port."""
    paths = _paths({"ingress": {"enabled": True}})
    assert paths
    for path, path_type, port in paths:
        assert _api_only(path), path
        assert path_type in {"Prefix", "Exact"}
        assert port == "http"


@pytest.mark.parametrize(
    ("path", "path_type"),
    [
        ("/", "Prefix"),
        ("/admin", "Prefix"),
        ("/readyz", "Exact"),
        ("/v1", "ImplementationSpecific"),
    ],
)
def test_a_path_beyond_the_api_fails_the_render_without_the_opt_in(
    path: str, path_type: str
) -> None:
    """`/`, `/admin`, `/readyz` or a controller-specific pattern need `ingress.apiOnly: false`."""
    hosts = [{"host": "llm.example.com", "paths": [{"path": path, "pathType": path_type}]}]
    with pytest.raises(helm.HelmRenderError, match=r"ingress\.apiOnly"):
        chart_render.render({"ingress": {"enabled": True, "hosts": hosts}})
    opted_in = _paths({"ingress": {"enabled": True, "apiOnly": False, "hosts": hosts}})
    assert opted_in == [(path, path_type, "http")]
