"""The gateway's command line: ``serve``, ``check-exposure``, ``keys``, ``router``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from gateway.settings import Settings, load_settings


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        server__host=getattr(args, "host", None),
        server__port=getattr(args, "port", None),
    )


def _serve(args: argparse.Namespace) -> int:
    from gateway.server import serve  # noqa: PLC0415  # uvicorn only when serving

    serve(_settings(args))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser."""
    parser = argparse.ArgumentParser(prog="tiergate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, default=None, help="YAML settings file")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8080)")
    serve.set_defaults(func=_serve)
    sub.add_parser("router", help="train, evaluate and use the tier router", add_help=False)
    sub.add_parser("simulate", help="run the vLLM simulator", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a gateway sub-command."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "router":
        from router_models.cli import main as router_main  # noqa: PLC0415  # ML deps on demand

        return router_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return int(args.func(args))
    except ValidationError as exc:
        print(f"tiergate: invalid settings:\n{exc}", file=sys.stderr)
        return 2
