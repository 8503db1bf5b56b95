"""The generated settings reference and JSON Schema are current, and example configs match."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

import router_models
from gateway.config.cli import config_schema, schema_text
from gateway.config.docs import render
from gateway.config.settings import Settings, load_settings
from gateway.config.strict import model_at
from router_models import DEFAULT_ARTIFACT, artifact_digest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = [REPO / "config/tiergate.sim.yaml", REPO / "deploy/compose/tiergate.gpu.yaml"]
REGENERATE = ".venv/bin/tiergate config docs --out docs/settings.md"


def test_settings_reference_is_current() -> None:
    """docs/settings.md is exactly what the settings models render (regenerate on change)."""
    committed = (REPO / "docs/settings.md").read_text(encoding="utf-8")
    assert committed == render(), f"docs/settings.md is stale: run `{REGENERATE}`"


def test_settings_reference_lists_every_option() -> None:
    """Every field of every section appears with its environment variable."""
    text = render()
    for section, field in Settings.model_fields.items():
        model = model_at(field.annotation, [] if section != "tiers" else ["x"])
        assert model is not None
        for name in model.model_fields:
            if name != "otel_env":
                assert f".{name}" in text, f"{section}.{name} missing"
    assert "`TIERGATE_RATELIMIT__BACKEND`" in text
    assert "Tracing samples 100 % when enabled" in text
    assert "auth: {store: redis}" in text


def test_every_option_has_a_description() -> None:
    """No option is documented with an empty description (write a field docstring)."""
    empty = [
        line for line in render().splitlines() if line.startswith("| `") and line.endswith("|  |")
    ]
    assert empty == []


def test_published_schema_is_current() -> None:
    """config/tiergate.schema.json matches `tiergate config schema`."""
    committed = (REPO / "config/tiergate.schema.json").read_text(encoding="utf-8")
    assert committed == schema_text(), (
        "config/tiergate.schema.json is stale: run "
        "`.venv/bin/tiergate config schema --out config/tiergate.schema.json`"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_reference_and_satisfy_schema(path: Path) -> None:
    """Each example config points editors at the schema and validates against it as written."""
    text = path.read_text(encoding="utf-8")
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (path.parent / first.split("=", 1)[1]).resolve()
    assert target == REPO / "config/tiergate.schema.json"
    jsonschema.validate(yaml.safe_load(text), json.loads(target.read_text()))


def test_schema_rejects_a_nested_typo() -> None:
    """An editor using the schema flags `ratelimit.backnd` like the gateway does."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"ratelimit": {"backnd": "redis"}}, config_schema())


def test_sim_config_empty_artifact_means_the_shipped_classifier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty router.artifact in tiergate.sim.yaml loads the shipped classifier, as it says."""
    monkeypatch.delenv("TIERGATE_ROUTER_ARTIFACT", raising=False)
    monkeypatch.delenv("TIERGATE_CONFIG", raising=False)
    path = REPO / "config/tiergate.sim.yaml"
    line = next(ln for ln in path.read_text().splitlines() if "artifact:" in ln)
    assert "empty: the classifier shipped with TierGate" in line
    assert load_settings(path).router.artifact is None
    assert router_models.load(None).artifact_id == artifact_digest(DEFAULT_ARTIFACT)
