"""Renders of the Helm chart and the parsed compose file, computed once per session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import chart_render
from tests.deploy.compose_file import load_compose


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    """compose.yaml, parsed."""
    return load_compose()


@pytest.fixture(scope="session")
def everything_values() -> dict[str, Any]:
    """The chart's "everything on" values file."""
    return chart_render.values_file(chart_render.EVERYTHING_ON)


@pytest.fixture(scope="session")
def default_render() -> dict[str, str]:
    """The chart rendered with its default values."""
    return chart_render.render(None)


@pytest.fixture(scope="session")
def everything_render(everything_values: dict[str, Any]) -> dict[str, str]:
    """The chart rendered with every optional part on."""
    return chart_render.render(everything_values)


@pytest.fixture(scope="session")
def default_objects(default_render: dict[str, str]) -> list[dict[str, Any]]:
    """Objects of the default render."""
    return chart_render.objects(default_render)


@pytest.fixture(scope="session")
def everything_objects(everything_render: dict[str, str]) -> list[dict[str, Any]]:
    """Objects of the everything-on render."""
    return chart_render.objects(everything_render)


@pytest.fixture(scope="session", params=["default", "everything-on"])
def any_objects(
    request: pytest.FixtureRequest,
    default_objects: list[dict[str, Any]],
    everything_objects: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Objects of each render in turn."""
    return default_objects if request.param == "default" else everything_objects
