"""``tiergate config schema``, ``tiergate config docs`` and ``tiergate config check FILE``.

``schema`` prints the JSON Schema of the config file, generated from the settings models (the
published copy is ``config/tiergate.schema.json``; example configs point editors at it with a
``# yaml-language-server: $schema=`` comment). ``check`` loads a file exactly as ``serve``
would and prints every effective value, secrets masked, with where it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gateway.config.pricing import price_warnings
from gateway.config.settings import Settings, load_settings_traced
from gateway.config.strict import Loc, dotted

# A value in YAML may be a ${VAR} or ${VAR:-default} interpolation, replaced before validation.
_INTERPOLATION_DEF = {
    "type": "string",
    "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}",
    "description": "An environment variable interpolation, replaced before validation.",
}
_SECRET_NAMES = frozenset({"admin_token", "pepper", "api_key"})


def _allow_interpolation(node: Any) -> None:
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict):
            for name, prop in list(properties.items()):
                _allow_interpolation(prop)
                keep = {k: prop.pop(k) for k in ("title", "description", "default") if k in prop}
                properties[name] = {**keep, "anyOf": [prop, {"$ref": "#/$defs/Interpolation"}]}
        for key, value in node.items():
            if key != "properties":
                _allow_interpolation(value)
    elif isinstance(node, list):
        for item in node:
            _allow_interpolation(item)


def config_schema() -> dict[str, Any]:
    """The JSON Schema of a TierGate config file."""
    schema = Settings.model_json_schema()
    _allow_interpolation(schema)
    schema.setdefault("$defs", {})["Interpolation"] = _INTERPOLATION_DEF
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "TierGate configuration"
    return schema


def schema_text() -> str:
    """The schema as the published file holds it."""
    return json.dumps(config_schema(), indent=2, sort_keys=True) + "\n"


def mask(loc: Loc, value: Any) -> Any:
    """Secrets shown as ``***``; a URL keeps everything but its password."""
    name = str(loc[-1]) if loc else ""
    if value in (None, ""):
        return value
    if name in _SECRET_NAMES:
        return "***"
    if isinstance(value, list):  # a tier's replica URLs may carry user-info too
        return [mask(loc, item) for item in value]
    if isinstance(value, str) and "://" in value:
        parts = urlsplit(value)
        if parts.password is not None:
            host = parts.hostname or ""
            netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
            return urlunsplit(parts._replace(netloc=netloc))
    return value


def _leaves(node: Any, loc: Loc = ()) -> list[tuple[Loc, Any]]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, (*loc, key))]
    return [(loc, node)]


def check_lines(config: Path) -> tuple[list[str], list[str]]:
    """``path: value  (source)`` for every effective value of ``config``, and its warnings
    (prices that make the fast tier dearer than the precise one)."""
    settings, origins = load_settings_traced(config)
    warnings = [w.message() for w in price_warnings(settings.tiers, settings.router)]
    rows = [
        (dotted(loc), json.dumps(mask(loc, value)), origins.of(loc))
        for loc, value in _leaves(settings.model_dump(mode="json"))
    ]
    width = max(len(path) + len(value) for path, value, _ in rows) + 3
    lines = [f"{path}: {value}".ljust(width) + f"({source})" for path, value, source in rows]
    return lines, warnings


def _schema(args: argparse.Namespace) -> int:
    text = schema_text()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


def _docs(args: argparse.Namespace) -> int:
    from gateway.config.docs import render  # noqa: PLC0415  # only for this command

    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


def _check(args: argparse.Namespace) -> int:
    lines, warnings = check_lines(args.file)
    for line in lines:
        print(line)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    noted = f" ({len(warnings)} warning{'s' if len(warnings) > 1 else ''})" if warnings else ""
    print(f"ok: {args.file} is a valid TierGate configuration{noted}", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    """Run ``tiergate config ...``."""
    parser = argparse.ArgumentParser(prog="tiergate config", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    schema = sub.add_parser("schema", help="print the config file's JSON Schema")
    schema.add_argument("--out", type=Path, default=None, help="write it to this file instead")
    schema.set_defaults(func=_schema)
    docs = sub.add_parser("docs", help="print the settings reference (docs/settings.md)")
    docs.add_argument("--out", type=Path, default=None, help="write it to this file instead")
    docs.set_defaults(func=_docs)
    check = sub.add_parser("check", help="validate FILE; print every value and its source")
    check.add_argument("file", type=Path, help="YAML settings file")
    check.set_defaults(func=_check)
    args = parser.parse_args(argv)
    return int(args.func(args))
