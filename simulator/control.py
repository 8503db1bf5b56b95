"""``/sim/``: a simulator-only control surface for tests and demos (not part of vLLM).

``GET /sim/stats`` reports counters and the last request seen; ``POST /sim/faults`` changes
failure-injection rates and health at runtime; ``POST /sim/reset`` zeroes the counters.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from simulator.schemas import SimError, encoder
from simulator.state import SimState

_JSON = "application/json"


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=encoder.encode(payload), status=status, content_type=_JSON)


def _bad(message: str) -> web.Response:
    return web.Response(body=SimError(400, message).body(), status=400, content_type=_JSON)


def add_control_routes(app: web.Application, state: SimState) -> None:
    """Register the ``/sim/`` routes for ``state``."""

    async def stats(_: web.Request) -> web.Response:
        return _json(state.stats())

    async def faults(request: web.Request) -> web.Response:
        try:
            changes = msgspec.json.decode(await request.read())
        except msgspec.DecodeError:
            return _bad("body must be a JSON object")
        if not isinstance(changes, dict):
            return _bad("body must be a JSON object")
        healthy = changes.pop("healthy", None)
        if healthy is not None and not isinstance(healthy, bool):
            return _bad("healthy must be a boolean")
        try:
            state.faults.update(changes)
        except (TypeError, ValueError) as exc:
            return _bad(str(exc))
        if healthy is not None:
            state.healthy = healthy
        return _json({**state.faults.rates.as_dict(), "healthy": state.healthy})

    async def reset(_: web.Request) -> web.Response:
        state.reset()
        return _json(state.stats())

    app.router.add_get("/sim/stats", stats)
    app.router.add_post("/sim/faults", faults)
    app.router.add_post("/sim/reset", reset)
