"""Serve the gateway app under one HTTP server candidate (for bench/servers/run.py only).

    python -m bench.servers.candidate --server guarded --config cfg.yaml --port 8080

``guarded`` is what ``tiergate serve`` runs; ``httptools`` is the old server (no head limit,
no deadlines, no cap); ``h11`` is uvicorn's pure-Python parser with its head limit; ``granian``
is the Rust/hyper server with its header-read timeout (needs ``pip install granian``).
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Any

import uvicorn

from gateway.composition import create_app, served
from gateway.config.settings import Settings, load_settings
from gateway.http.connections import ConnectionGuard
from gateway.http.native import Handler
from gateway.http.protocol import GuardedHttpToolsProtocol
from gateway.http.server import connection_limits

SERVERS = ("guarded", "httptools", "h11", "granian")


def _uvicorn(
    app: Any, settings: Settings, server: str, guard: ConnectionGuard, native: Handler
) -> None:
    http: Any = {"httptools": "httptools", "h11": "h11"}.get(server)
    extra: dict[str, Any] = {}
    if server == "guarded":  # as `tiergate serve`: the inference endpoints served natively
        http = functools.partial(GuardedHttpToolsProtocol, guard=guard, native=native)
    if server == "h11":
        extra["h11_max_incomplete_event_size"] = settings.server.max_head_bytes
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop",
        http=http,
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,
        log_level="warning",
        server_header=False,
        date_header=False,
        proxy_headers=False,
        **extra,
    )
    uvicorn.Server(config).run()


def _granian(settings: Settings) -> None:
    import uvloop  # noqa: PLC0415  # only here
    from granian.constants import HTTPModes, Interfaces  # noqa: PLC0415  # optional
    from granian.http import HTTP1Settings  # noqa: PLC0415  # optional
    from granian.server.embed import Server  # noqa: PLC0415  # optional

    app = create_app(settings)
    server = Server(
        app,
        address=settings.server.host,
        port=settings.server.port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=False,
        backlog=2048,
        http1_settings=HTTP1Settings(
            header_read_timeout=int(settings.server.head_timeout_s * 1000)
        ),
        log_level="warning",  # type: ignore[arg-type, unused-ignore]  # granian takes the name
    )
    uvloop.run(server.serve())


def main() -> None:
    """Parse arguments and serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=SERVERS, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    os.environ.pop("TIERGATE_CONFIG", None)
    settings = load_settings(args.config, server__port=args.port)
    if args.server == "granian":
        _granian(settings)
        return
    guard = ConnectionGuard(connection_limits(settings.server))
    app, native = served(settings, guard)
    _uvicorn(app, settings, args.server, guard, native)


if __name__ == "__main__":
    main()
