"""Strict settings: unknown keys at any depth, in the file and in TIERGATE_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gateway.config.settings import Settings, load_settings, load_settings_traced
from gateway.config.strict import ConfigError, model_at

TIERS = {
    "fast": {"model": "f", "replicas": ["http://127.0.0.1:8101"]},
    "precise": {"model": "p", "replicas": ["http://127.0.0.1:8102"]},
}


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _problems(config: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    return caught.value.problems


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"ratelimit": {"backnd": "redis"}}, "ratelimit.backnd (file "),
        ({"telemetry": {"tracng": True}}, "did you mean `tracing`?"),
        ({"serer": {}}, "serer (file"),
        (
            {"tiers": {**TIERS, "fast": {**TIERS["fast"], "max_token_cap": 1}}},
            "tiers.fast.max_token_cap (file",
        ),
        (
            {"tiers": {**TIERS, "fast": {**TIERS["fast"], "timeouts": {"conect_s": 1}}}},
            "tiers.fast.timeouts.conect_s",
        ),
    ],
)
def test_file_typos_refused_at_every_depth(
    tmp_path: Path, data: dict[str, Any], expected: str
) -> None:
    """A misspelled key anywhere in the file is refused with its dotted path."""
    problems = _problems(_write(tmp_path, data))
    assert any(expected in p for p in problems), problems
    assert all("unknown setting" in p for p in problems)


def test_file_typo_suggests_closest_name(tmp_path: Path) -> None:
    """The message names the valid key the typo was most likely meant to be."""
    problems = _problems(_write(tmp_path, {"ratelimit": {"backnd": "redis"}}))
    assert problems == [
        f"ratelimit.backnd (file {tmp_path / 'tiergate.yaml'}): "
        "unknown setting; did you mean `backend`?"
    ]


def test_nonsense_key_has_no_suggestion(tmp_path: Path) -> None:
    """A key like no valid one is refused without a misleading suggestion."""
    problems = _problems(_write(tmp_path, {"server": {"zzzzqqq": 1}}))
    assert problems[0].endswith("unknown setting")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("TIERGATE_RATELIMIT__BACKND", "did you mean TIERGATE_RATELIMIT__BACKEND?"),
        ("TIERGATE_TELEMETRY__TRACNG", "did you mean TIERGATE_TELEMETRY__TRACING?"),
        ("TIERGATE_TIERS__FAST__MAX_TOKEN_CAP", "mean TIERGATE_TIERS__FAST__MAX_TOKENS_CAP?"),
        ("TIERGATE_TIERS__FAST__TIMEOUTS__CONECT_S", "TIERGATE_TIERS__FAST__TIMEOUTS__CONNECT_S?"),
        ("TIERGATE_RATELIMT__BACKEND", "did you mean TIERGATE_RATELIMIT__BACKEND?"),
        ("TIERGATE_SERVER_PORT", "did you mean TIERGATE_SERVER__PORT?"),
        ("TIERGATE_SERVR", "did you mean TIERGATE_SERVER?"),
        ("TIERGATE_SERVER___PORT", "did you mean TIERGATE_SERVER__PORT?"),
    ],
)
def test_environment_typos_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, expected: str
) -> None:
    """A TIERGATE_* variable that names no setting is refused, naming the closest one."""
    monkeypatch.setenv(name, "1")
    problems = _problems()
    assert len(problems) == 1
    assert problems[0].startswith(f"environment variable {name}: ")
    assert expected in problems[0]


def test_unrelated_tiergate_variables_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client and compose variables (TIERGATE_KEY, TIERGATE_IMAGE...) do not stop the gateway."""
    for name in ("TIERGATE_KEY", "TIERGATE_IMAGE", "TIERGATE_FAST_GPU", "TIERGATE_E2E"):
        monkeypatch.setenv(name, "x")
    assert load_settings().server.port == 8080


def test_interpolated_variable_is_not_a_typo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIERGATE_REDIS_URL is fine when the config file interpolates ${TIERGATE_REDIS_URL}."""
    config = tmp_path / "c.yaml"
    config.write_text("redis:\n  url: ${TIERGATE_REDIS_URL:-redis://127.0.0.1:1/0}\n")
    monkeypatch.setenv("TIERGATE_REDIS_URL", "redis://10.0.0.1:6379/0")
    assert load_settings(config).redis.url == "redis://10.0.0.1:6379/0"
    monkeypatch.setenv("TIERGATE_REDIS_URL", "redis://10.0.0.1:6379/0")
    assert "did you mean TIERGATE_REDIS__URL?" in _problems()[0]


def test_valid_environment_override_applies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A correct nested variable still overrides, and its origin is reported as env."""
    monkeypatch.setenv("TIERGATE_TIERS__FAST__MAX_TOKENS_CAP", "77")
    monkeypatch.setenv("TIERGATE_RATELIMIT__BACKEND", "redis")
    settings, origins = load_settings_traced(_write(tmp_path, {"tiers": TIERS}))
    assert settings.tiers["fast"].max_tokens_cap == 77
    assert settings.ratelimit.backend == "redis"
    assert origins.of(("ratelimit", "backend")) == "env TIERGATE_RATELIMIT__BACKEND"
    assert origins.of(("server", "port")) == "default"
    assert origins.of(("tiers", "fast", "model")) == f"file {tmp_path / 'tiergate.yaml'}"


def test_bad_value_names_its_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A bad value's message says which variable or file it came from."""
    monkeypatch.setenv("TIERGATE_SERVER__PORT", "abc")
    problems = _problems()
    assert problems[0].startswith("server.port (env TIERGATE_SERVER__PORT): ")
    monkeypatch.delenv("TIERGATE_SERVER__PORT")
    config = _write(tmp_path, {"server": {"port": 70000}})
    assert _problems(config)[0].startswith(f"server.port (file {config}): ")


@pytest.mark.parametrize(
    ("name", "field"),
    [("TIERGATE_TIERS", "tiers"), ("TIERGATE_TIERS__FAST__REPLICAS", "tiers")],
)
def test_a_value_that_is_not_json_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, field: str
) -> None:
    """A section or list variable whose value is not JSON is named (pydantic-settings names
    only the field), and its value, which may hold a secret, is not quoted."""
    monkeypatch.setenv(name, "{not json sk-secret")
    problems = _problems()
    assert problems == [
        f"environment variable {name}: not valid JSON for the setting '{field}' (a section "
        "takes a JSON object, a list a JSON array)"
    ]


def test_environment_tier_values_merge_over_the_embedded_tiers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no tiers in the file, TIERGATE_TIERS__FAST__* change the embedded fast tier only."""
    monkeypatch.setenv("TIERGATE_TIERS__FAST__REPLICAS", '["http://10.0.0.5:8000"]')
    settings, origins = load_settings_traced(_write(tmp_path, {"auth": {"enabled": False}}))
    assert settings.tiers["fast"].replicas == ["http://10.0.0.5:8000"]
    assert settings.tiers["fast"].model == "tiergate-fast"
    assert settings.tiers["precise"].model == "tiergate-precise"
    assert origins.of(("tiers", "fast", "replicas")) == "env TIERGATE_TIERS__FAST__REPLICAS"
    assert origins.of(("tiers", "fast", "model")) == "default"
    monkeypatch.setenv("TIERGATE_TIERS__FAST__MODEL", "m")
    settings = load_settings(None)
    assert sorted(settings.tiers) == ["fast", "precise"]
    assert settings.tiers["fast"].model == "m"


def test_a_file_with_tiers_replaces_the_embedded_tiers(tmp_path: Path) -> None:
    """The file's tiers are the whole set: embedded tiers it does not name are not added."""
    tiers = {**TIERS, "code": {"model": "c", "replicas": ["http://127.0.0.1:8103"]}}
    assert sorted(load_settings(_write(tmp_path, {"tiers": tiers})).tiers) == [
        "code",
        "fast",
        "precise",
    ]
    only_fast = {"tiers": {"fast": TIERS["fast"]}, "router": {"precise_tier": "fast"}}
    assert sorted(load_settings(_write(tmp_path, only_fast)).tiers) == ["fast"]


def test_a_rule_across_sections_names_every_source_not_just_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An error on the whole settings names the variables too, and echoes none of it."""
    monkeypatch.setenv("TIERGATE_ROUTER__PRECISE_TIER", "big")
    config = _write(tmp_path, {"auth": {"admin_token": "hunter2-hunter2-hunter2"}})
    problems = _problems(config)
    assert problems[0].startswith(f"settings (env TIERGATE_ROUTER__PRECISE_TIER, file {config}): ")
    assert "hunter2" not in problems[0]
    monkeypatch.delenv("TIERGATE_ROUTER__PRECISE_TIER")
    monkeypatch.setenv("TIERGATE_TIERS__FAST__MODEL", "m")
    monkeypatch.setenv("TIERGATE_ROUTER__FAST_TIER", "small")
    problems = _problems()
    assert problems[0].startswith("settings (env ")
    assert "file" not in problems[0].split(":")[0]


def test_secret_values_not_echoed(tmp_path: Path) -> None:
    """An invalid secret-bearing value (a Redis URL) is not repeated in the message."""
    config = _write(tmp_path, {"redis": {"url": ["redis://u:hunter2@h"]}})
    assert "hunter2" not in " ".join(_problems(config))


def _models(annotation: object, seen: set[type[BaseModel]]) -> None:
    model = model_at(annotation, [])
    if model is None or model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
            _models(candidate, seen)


def test_every_settings_section_forbids_unknown_keys() -> None:
    """Every model reachable from Settings refuses extras (new sections must derive Section)."""
    seen: set[type[BaseModel]] = set()
    _models(Settings, seen)
    assert len(seen) > 10
    lax = [m.__name__ for m in seen if m.model_config.get("extra") != "forbid"]
    assert lax == [], f"derive these from gateway.settings_strict.Section: {lax}"


def test_a_tier_name_with_a_bar_is_refused(tmp_path: Path) -> None:
    """The usage totals in Redis are kept under ``tier|tenant|key|field``, and a tenant may
    hold ``|``: a tier's name may not, or the two could not be told apart."""
    tiers = {**TIERS, "code|eu": {"model": "c", "replicas": ["http://127.0.0.1:8103"]}}
    problems = _problems(_write(tmp_path, {"tiers": tiers}))
    assert any("'|'" in problem and "code|eu" in problem for problem in problems), problems
