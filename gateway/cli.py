"""The gateway's command line: ``serve``, ``check-exposure``, ``keys``, ``router``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from gateway.exposure import Finding, check_exposure, format_finding, refuses_start
from gateway.settings import Settings, load_settings


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        server__host=getattr(args, "host", None),
        server__port=getattr(args, "port", None),
    )


def _serve(args: argparse.Namespace) -> int:
    from gateway.auth import NoKeysConfigured, preflight  # noqa: PLC0415  # only when serving
    from gateway.server import serve  # noqa: PLC0415  # uvicorn only when serving

    settings = _settings(args)
    if not _exposure_preflight(settings):
        print("tiergate: refusing to start (exposure.mode is strict)", file=sys.stderr)
        return 2
    try:
        preflight(settings)
        serve(settings)
    except NoKeysConfigured as exc:
        print(f"tiergate: refusing to start: {exc}", file=sys.stderr)
        return 2
    return 0


def _findings(settings: Settings) -> list[Finding]:
    uses_redis = "redis" in (settings.ratelimit.backend, settings.auth.store)
    return check_exposure(
        bind_host=settings.server.host,
        tls_in_front=settings.server.tls_terminated_upstream,
        backends={name: tier.replicas for name, tier in settings.tiers.items()},
        redis_url=settings.redis.url if uses_redis else None,
    )


def _check_exposure(args: argparse.Namespace) -> int:
    settings = _settings(args)
    findings = _findings(settings)
    for finding in findings:
        print(format_finding(finding))
    if not findings:
        print("ok: private backends only; the gateway is not public without TLS in front")
    mode = "strict" if args.strict else settings.exposure.mode
    return 1 if refuses_start(findings, mode) else 0


def _exposure_preflight(settings: Settings) -> bool:
    """Print findings at start; False when strict mode refuses to start."""
    mode = settings.exposure.mode
    if mode == "off":
        return True
    findings = _findings(settings)
    for finding in findings:
        print(f"tiergate: exposure {format_finding(finding)}", file=sys.stderr)
    return not refuses_start(findings, mode)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser."""
    parser = argparse.ArgumentParser(prog="tiergate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, default=None, help="YAML settings file")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8080)")
    serve.set_defaults(func=_serve)
    check = sub.add_parser("check-exposure", help="check backends and bind address exposure")
    check.add_argument("--config", type=Path, default=None, help="YAML settings file")
    check.add_argument("--host", default=None, help="bind address to check")
    check.add_argument("--strict", action="store_true", help="exit 1 on any error finding")
    check.set_defaults(func=_check_exposure)
    sub.add_parser("router", help="train, evaluate and use the tier router", add_help=False)
    sub.add_parser("keys", help="create, list, revoke and rotate API keys", add_help=False)
    sub.add_parser("simulate", help="run the vLLM simulator", add_help=False)
    sub.add_parser("bench", help="measure TTFT/TPOT of the gateway or a backend", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a gateway sub-command."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "router":
        from router_models.cli import main as router_main  # noqa: PLC0415  # ML deps on demand

        return router_main(args_list[1:])
    if args_list and args_list[0] == "keys":
        from gateway.keys_cli import main as keys_main  # noqa: PLC0415  # loaded on demand

        return keys_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return int(args.func(args))
    except ValidationError as exc:
        print(f"tiergate: invalid settings:\n{exc}", file=sys.stderr)
        return 2
