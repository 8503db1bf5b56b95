"""The Helm chart rendered offline with helm-python-sdk, as Kubernetes objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "tiergate"
EVERYTHING_ON = CHART / "ci" / "everything-on.yaml"
RELEASE = "tg"
NAMESPACE = "llm"


def values_file(path: Path) -> dict[str, Any]:
    """A values file as a dictionary."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def render(values: dict[str, Any] | None) -> dict[str, str]:
    """Template path -> rendered text, for an install of release ``tg`` in ``llm``."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in a render (NOTES.txt and empty documents left out)."""
    found: list[dict[str, Any]] = []
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def of_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [item for item in items if item["kind"] == kind]


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels only, as the chart writes them) selects ``labels``."""
    assert set(selector) <= {"matchLabels"}, f"unexpected selector form: {selector}"
    wanted = selector.get("matchLabels") or {}
    return all(labels.get(key) == value for key, value in wanted.items())


def pod_templates(items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod template) of every Deployment."""
    return [(d["metadata"]["name"], d["spec"]["template"]) for d in of_kind(items, "Deployment")]
