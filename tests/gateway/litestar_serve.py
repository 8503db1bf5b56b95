"""``tiergate serve`` with the native endpoints off: every request, the inference endpoints
included, goes to Litestar through the server's own protocol and ASGI cycle (gateway/http/asgi.py).

    python -m tests.gateway.litestar_serve serve --config cfg.yaml --port 8080

Only for the edge contract tests (tests/gateway/http/test_edge_contract.py), which run the same edge
rules against this, ``tiergate serve`` itself and Litestar's in-process test client.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from litestar import Litestar

from gateway.composition import served
from gateway.config.settings import Settings, load_settings
from gateway.http.connections import ConnectionGuard
from gateway.http.native import Handler
from gateway.http.server import run
from gateway.upstream.worker_share import WorkerRole


def litestar_only(
    settings: Settings, guard: ConnectionGuard, worker: WorkerRole | None
) -> tuple[Litestar, Handler | None]:
    """What ``tiergate serve`` serves, less the natively served endpoints."""
    app, _ = served(settings, guard, worker)
    return app, None


def main() -> None:
    """Parse ``serve --config PATH --port N [--workers 1]`` and serve until interrupted."""
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, choices=[1], default=1)
    args = parser.parse_args()
    run(load_settings(args.config, server__port=args.port), litestar_only)


if __name__ == "__main__":
    main()
