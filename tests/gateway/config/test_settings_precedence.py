"""README "Configuration": flags over TIERGATE_* variables over the YAML file over the
embedded defaults, and what those defaults are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config.settings import load_settings, load_settings_traced


def test_the_embedded_defaults_are_two_loopback_tiers_and_a_loopback_gateway() -> None:
    """With no file, variable or flag: fast on 127.0.0.1:8101, precise on :8102, the gateway
    on 127.0.0.1:8080."""
    settings = load_settings(None)
    assert settings.server.host == "127.0.0.1"
    assert settings.server.port == 8080
    assert {name: tier.replicas for name, tier in settings.tiers.items()} == {
        "fast": ["http://127.0.0.1:8101"],
        "precise": ["http://127.0.0.1:8102"],
    }


def test_each_source_wins_over_the_ones_below_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One field set at every level: the flag wins, then the variable, then the file; the
    reported origin names the winner."""
    config = tmp_path / "tiergate.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": 7001}}), encoding="utf-8")

    settings, origins = load_settings_traced(config)
    assert settings.server.port == 7001
    assert origins.of(("server", "port")) == f"file {config}"

    monkeypatch.setenv("TIERGATE_SERVER__PORT", "7002")
    settings, origins = load_settings_traced(config)
    assert settings.server.port == 7002
    assert origins.of(("server", "port")) == "env TIERGATE_SERVER__PORT"

    settings, origins = load_settings_traced(config, server__port=7003)
    assert settings.server.port == 7003
    assert origins.of(("server", "port")) == "flag --port"

    # An unset flag (None) leaves the variable in force.
    assert load_settings(config, server__port=None).server.port == 7002
