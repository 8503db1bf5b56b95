"""The gateway's command line: ``serve``, ``check-exposure``, ``config``, ``keys``, ``router``,
``simulate`` and ``bench``.

Start-up failures (configuration, files, the listening port) print one ``tiergate: ...`` line
per problem and exit 2, without a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import select
import signal
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.config.exposure import (
    Finding,
    Severity,
    check_exposure,
    format_finding,
    metrics_listen_host,
    refuses_start,
)
from gateway.config.settings import Settings, load_settings
from gateway.config.strict import ConfigError

if TYPE_CHECKING:
    from gateway.http.workers import WorkerCount
    from gateway.telemetry.logging import LogSink


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        server__host=getattr(args, "host", None),
        server__port=getattr(args, "port", None),
        server__workers=getattr(args, "workers", None),
    )


def _serve(args: argparse.Namespace) -> int:
    if args.worker_index is not None:  # first: the supervisor may die while this one starts
        from gateway.http.workers import die_with_supervisor  # noqa: PLC0415  # only in workers

        # A terminal's Ctrl-C reaches the whole group: the supervisor turns it into one
        # SIGTERM for each worker, which drains (a SIGINT would end one still starting with a
        # traceback, and cut the streams of one draining: DrainingServer).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_supervisor(args.supervisor_pid)
    # The settings and secret files are checked before the app's modules (the web framework,
    # Redis, the router) are imported: a config `serve` refuses fails in a fraction of a second.
    settings = _settings(args)
    if args.worker_index is not None:
        return _serve_worker(args, settings)
    if not _exposure_preflight(settings):
        print("tiergate: refusing to start (exposure.mode is strict)", file=sys.stderr)
        return 2
    _read_secret_files(settings)
    from gateway.http.workers import WorkersRefused, resolve_workers, usable_cores  # noqa: PLC0415

    try:
        workers = resolve_workers(settings, args.workers, usable_cores())
    except WorkersRefused as exc:
        refusal: str | None = str(exc)
    else:
        refusal = _keys_refusal(settings)
    if refusal is not None:
        print(f"tiergate: refusing to start: {refusal}", file=sys.stderr)
        return 2
    settings = settings.model_copy(
        update={"server": settings.server.model_copy(update={"workers": workers.count})}
    )
    return _run(settings, workers, args.config)


def _keys_refusal(settings: Settings) -> str | None:
    """Why serving is refused for want of a usable key, if it is. With auth off there is
    nothing to check and the auth modules (the web framework, Redis) are not imported here:
    a supervisor then starts its workers that much sooner (``bench/workers/startup.py``)."""
    if not settings.auth.enabled:
        return None
    from gateway.access.auth import NoKeysConfigured, preflight  # noqa: PLC0415  # only when serving

    try:
        preflight(settings)
    except NoKeysConfigured as exc:
        return str(exc)
    return None


def _read_secret_files(settings: Settings) -> None:
    """Read every tier's upstream keys and the admin token once, before any worker starts: a
    bad one is one line naming its setting and exit 2, not a failure in every worker."""
    for name, tier in settings.tiers.items():
        where = f"tiers.{name}.api_key_file ({tier.api_key_file})"
        try:
            tier.read_api_keys()
        except ValueError as exc:  # the file's text is never quoted: it holds secrets
            raise ConfigError([f"{where}: {exc}"]) from None
        except OSError as exc:
            raise ConfigError([f"{where}: {_unreadable(exc)}"]) from None
    try:
        settings.auth.read_admin_token()
    except OSError as exc:
        where = f"auth.admin_token_file ({settings.auth.admin_token_file})"
        raise ConfigError([f"{where}: {_unreadable(exc)}"]) from None


def _unreadable(exc: OSError) -> str:
    """Why a settings file could not be read, in words (not found, not allowed...)."""
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, PermissionError):
        return "permission denied (the gateway's user must be able to read it)"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a file"
    return exc.strerror or str(exc)


def _run(settings: Settings, workers: WorkerCount, config: Path | None) -> int:
    if workers.count == 1:
        from gateway.composition import serve  # noqa: PLC0415  # uvicorn only when serving

        try:
            serve(settings, logging_ready=workers.log)
        except KeyboardInterrupt:  # Ctrl-C: served until drained; uvicorn raises it again after
            return 130  # as a shell reports an interrupted command, without a traceback
        return 0
    from gateway.http.workers import Supervisor  # noqa: PLC0415  # only when serving

    settings.auth.read_admin_token()  # a missing token file: one error here, not one per worker
    supervisor = Supervisor(settings, workers.count, config)
    logs: list[LogSink] = []

    def set_up_logging() -> None:  # while the workers start (it imports telemetry's modules)
        # The supervisor's own lines (server.worker_exited...) in the configured format and place.
        from gateway.telemetry.logging import configure_logging  # noqa: PLC0415  # only when serving

        logs.append(configure_logging(settings.telemetry))
        workers.log()

    try:
        return supervisor.run(meanwhile=set_up_logging)
    finally:
        for log in logs:
            log.close()


def _serve_worker(args: argparse.Namespace, settings: Settings) -> int:
    """One worker of a group started by the supervisor (hidden options)."""
    import socket  # noqa: PLC0415  # only in workers

    from gateway.composition import serve  # noqa: PLC0415  # uvicorn only when serving
    from gateway.upstream.worker_share import WorkerRole  # noqa: PLC0415  # only in workers

    role = WorkerRole(args.worker_index, args.workers, Path(args.share_dir))
    serve(settings, worker=role, sock=socket.socket(fileno=args.worker_fd))
    return 0


def _findings(settings: Settings) -> list[Finding]:
    uses_redis = "redis" in (settings.ratelimit.backend, settings.auth.store)
    return check_exposure(
        bind_host=settings.server.host,
        tls_in_front=settings.server.tls_terminated_upstream,
        backends={name: tier.replicas for name, tier in settings.tiers.items()},
        redis_url=settings.redis.url if uses_redis else None,
        metrics_host=metrics_listen_host(settings),
    )


def _check_exposure(args: argparse.Namespace) -> int:
    settings = _settings(args)
    findings = _findings(settings)
    if args.probe:
        from gateway.config.exposure_probe import probe_backends  # noqa: PLC0415  # network IO on demand

        backends = {name: tier.replicas for name, tier in settings.tiers.items()}
        uses_redis = "redis" in (settings.ratelimit.backend, settings.auth.store)
        findings += probe_backends(backends, settings.redis.url if uses_redis else None)
    for finding in findings:
        print(format_finding(finding))
    if not findings:
        print("ok: private backends only; the gateway is not public without TLS in front")
    # Any error finding fails the check, whatever exposure.mode says about starting anyway.
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


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
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: usable cores; 1 with the memory rate-limit backend)",
    )
    for hidden, kind in (
        ("--worker-index", int),
        ("--worker-fd", int),
        ("--share-dir", str),
        ("--supervisor-pid", int),
    ):
        serve.add_argument(hidden, type=kind, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)
    check = sub.add_parser("check-exposure", help="check backends and bind address exposure")
    check.add_argument("--config", type=Path, default=None, help="YAML settings file")
    check.add_argument("--host", default=None, help="bind address to check")
    check.add_argument(
        "--strict",
        action="store_true",
        help="accepted for scripts; any error finding exits 1 anyway",
    )
    check.add_argument(
        "--probe",
        action="store_true",
        help="also ask the backends: does a loopback one answer on this host's other "
        "addresses, and which admin routes answer without credentials (GET only)",
    )
    check.set_defaults(func=_check_exposure)
    sub.add_parser(
        "config", help="print the config file's JSON Schema or check a config file", add_help=False
    )
    sub.add_parser("router", help="train, evaluate and use the tier router", add_help=False)
    sub.add_parser("keys", help="create, list, revoke and rotate API keys", add_help=False)
    sub.add_parser("simulate", help="run the vLLM simulator", add_help=False)
    sub.add_parser("bench", help="measure TTFT/TPOT of the gateway or a backend", add_help=False)
    return parser


def _dispatch(args_list: list[str]) -> int:
    if args_list[:2] == ["router", "dial"]:  # talks to a running gateway: HTTP, not ML
        from gateway.routing.dial_cli import main as dial_main  # noqa: PLC0415  # loaded on demand

        return dial_main(args_list[2:])
    if args_list and args_list[0] == "router":
        from router_models.cli import main as router_main  # noqa: PLC0415  # ML deps on demand

        return router_main(args_list[1:])
    if args_list and args_list[0] == "keys":
        from gateway.access.keys_cli import main as keys_main  # noqa: PLC0415  # loaded on demand

        return keys_main(args_list[1:])
    if args_list and args_list[0] == "config":
        from gateway.config.cli import main as config_main  # noqa: PLC0415  # loaded on demand

        return config_main(args_list[1:])
    args = build_parser().parse_args(args_list)
    return int(args.func(args))


# Sub-commands other installed packages provide (the simulator's ``simulate``, the load
# generator's ``bench``), found by entry point so that the gateway never imports them.
COMMANDS_GROUP = "tiergate.commands"


def _plugin(name: str) -> Callable[[list[str]], int] | None:
    for entry in entry_points(group=COMMANDS_GROUP):
        if entry.name == name:
            command: Callable[[list[str]], int] = entry.load()
            return command
    return None


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fd (captured), or no poll here
        return False


def main(argv: list[str] | None = None) -> int:
    """Run a sub-command; ``--debug`` anywhere shows tracebacks of start-up failures."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    plugin = _plugin(args_list[0]) if args_list else None
    if plugin is not None:
        return plugin(args_list[1:])
    debug = "--debug" in args_list
    args_list = [a for a in args_list if a != "--debug"]
    if args_list[:1] == ["serve"] and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        # `kill -USR1 PID` (the supervisor or any worker): every thread's Python stack on
        # stderr, for a process that hangs (a start that never ends, a wedged loop). Not
        # where a wrapper took the signal first (a profiler's or a test's own use of it).
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        return _dispatch(args_list)
    except ConfigError as exc:
        if debug:
            raise
        for problem in exc.problems:
            print(f"tiergate: {problem}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if debug or not _stdout_gone():
            raise
        # `tiergate config check FILE | head`: the reader left, which is no failure to report.
        # Point stdout at /dev/null so that the exit's own flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # a file named in the settings, or the listening port (ListenError)
        if debug:
            raise
        print(f"tiergate: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the last resort: one line, not a traceback, unless --debug
        if debug:
            raise
        print(
            f"tiergate: {type(exc).__name__}: {exc} (rerun with --debug for details)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
