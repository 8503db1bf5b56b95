"""compose.yaml as data: loading, variable interpolation, and the services of a profile."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_PATH = REPO / "compose.yaml"

# Compose interpolation forms: ${VAR}, ${VAR:-default}, ${VAR-default}; `$$` escapes a dollar.
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def load_compose() -> dict[str, Any]:
    """The parsed compose file (YAML anchors and merge keys resolved)."""
    data = yaml.safe_load(COMPOSE_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """``value`` with compose variables replaced as `docker compose` would, given ``env``."""
    variables = env or {}
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name, operator, default = match.group(1), match.group(2), match.group(3)
            found = variables.get(name)
            if found is None or (found == "" and operator == ":-"):
                return default or ""
            return found

        return _VARIABLE.sub(replace, value).replace("$$", "$")
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    return value


def services_for(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile <profile> up` starts."""
    return {
        name: spec
        for name, spec in compose["services"].items()
        if not spec.get("profiles") or profile in spec["profiles"]
    }


def networks_of(service: dict[str, Any]) -> list[str]:
    """The networks a service joins (list or mapping form)."""
    return list(service.get("networks", ["default"]))


def environment_of(service: dict[str, Any]) -> dict[str, str | None]:
    """A service's environment as a mapping (list or mapping form)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) if "=" in item else (item, None) for item in env)
        return dict(pairs)
    return {key: (None if value is None else str(value)) for key, value in env.items()}


def duration_seconds(text: str) -> float:
    """A compose duration (``630s``, ``1m30s``, ``15m``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert parts, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)
