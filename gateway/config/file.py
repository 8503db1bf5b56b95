"""Reading the YAML settings file: ``${VAR}`` / ``${VAR:-default}`` interpolation, a key given
twice refused, and one-line :class:`ConfigError` messages for every way the file can be bad.

Only ``gateway/config/settings.py`` calls this; together they are the only code that reads the
environment or configuration files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from gateway.config.strict import ConfigError

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(text: str) -> str:
    def repl(match: re.Match[str]) -> str:
        value = os.environ.get(match.group(1))
        if value is None or (value == "" and match.group(2) is not None):
            return match.group(2) or ""
        return value

    return _INTERPOLATION.sub(repl, text)


def _read_config(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"config file {path}: not found"]) from None
    except IsADirectoryError:
        raise ConfigError([f"config file {path}: is a directory, not a file"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"config file {path}: not UTF-8 text"]) from None
    except OSError as exc:
        raise ConfigError([f"config file {path}: cannot be read ({exc.strerror})"]) from None


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (the later would win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool | None):
                continue  # an unhashable key: SafeLoader's own error says so
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file with ``${VAR:-default}`` interpolation."""
    try:
        data = yaml.load(_interpolate(_read_config(path)), Loader=_StrictLoader) or {}  # noqa: S506  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError([f"config file {path}{where}: invalid YAML: {exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"config file {path}: invalid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"config file {path}: the top level must be a mapping of sections"])
    return data


def interpolated_names(path: Path) -> set[str]:
    """The variables a config file interpolates with ``${VAR}``."""
    return {m.group(1) for m in _INTERPOLATION.finditer(_read_config(path))}
