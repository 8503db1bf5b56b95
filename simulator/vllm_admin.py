"""vLLM's routes outside ``/v1``: open to anyone who reaches the port, even with ``--api-key``.

vLLM 0.33 always serves ``POST /scale_elastic_ep``, ``POST /is_scaling_elastic_ep`` and
``GET /kv_event_sources`` (``--vllm-version current``; absent for ``0.11``), and ``GET /load``
(``{"server_load": N}``: requests in flight with ``--enable-server-load-tracking``, else 0). With
``--dev-mode`` (vLLM's ``VLLM_SERVER_DEV_MODE=1``) the simulator also serves sleep mode
(``POST /sleep?level=N``, ``POST /wake_up``, ``GET /is_sleeping``), ``POST
/reset_prefix_cache`` and ``GET /server_info``; with ``--enable-gated-routes`` the routes vLLM
serves behind their own flags (``/start_profile``, ``/stop_profile``, ``/tokenizer_info``,
``/fault_tolerance/apply``, ``/fault_tolerance/status``). None of them checks a key, as in
vLLM. They change nothing in the simulator but its sleep level, which
``vllm:engine_sleep_state`` reports and ``POST /sim/sleep`` sets too.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from simulator.schemas import SimError, encoder
from simulator.state import SimState

_JSON = "application/json"
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # by sleep level 0, 1, 2


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=encoder.encode(payload), status=status, content_type=_JSON)


def _bad(message: str) -> web.Response:
    return web.Response(body=SimError(400, message).body(), status=400, content_type=_JSON)


def asleep_response() -> web.Response:
    """What a completion request gets while the engine sleeps: 503."""
    error = SimError(503, "The engine is sleeping; wake it up first (POST /wake_up).")
    return web.Response(body=error.body(), status=503, content_type=_JSON)


def _level(text: str | None) -> int | None:
    """A sleep level 0, 1 or 2 from a query or JSON value; ``None`` when it is none of them."""
    try:
        level = int(text) if text is not None else 1
    except ValueError:
        return None
    return level if level in (0, 1, 2) else None


def _sleep_routes(app: web.Application, state: SimState) -> None:
    async def sleep(request: web.Request) -> web.Response:
        level = _level(request.query.get("level"))
        if level is None or level == 0:
            return _bad("level must be 1 or 2")
        state.sleep_level = level
        return web.Response(status=200)

    async def wake_up(_: web.Request) -> web.Response:
        state.sleep_level = 0
        return web.Response(status=200)

    async def is_sleeping(_: web.Request) -> web.Response:
        return _json({"is_sleeping": state.sleep_level > 0})

    async def server_info(_: web.Request) -> web.Response:
        return _json({"model": state.model, "max_model_len": state.config.max_model_len})

    async def reset_prefix_cache(_: web.Request) -> web.Response:
        state.engine.cache.drop_unused()
        return web.Response(status=200)

    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)


def _elastic_routes(app: web.Application) -> None:
    async def scale(request: web.Request) -> web.Response:
        try:
            body = msgspec.json.decode(await request.read() or b"{}")
        except msgspec.DecodeError:
            body = None
        size = body.get("new_data_parallel_size") if isinstance(body, dict) else None
        if not isinstance(size, int) or size < 1:
            return _bad("new_data_parallel_size is required")
        return _json({"message": f"Scaled to {size} data parallel engines (simulated)"})

    async def is_scaling(_: web.Request) -> web.Response:
        return _json({"is_scaling_elastic_ep": False})

    async def kv_event_sources(_: web.Request) -> web.Response:
        return _json({"kv_event_sources": []})

    app.router.add_post("/scale_elastic_ep", scale)
    app.router.add_post("/is_scaling_elastic_ep", is_scaling)
    app.router.add_get("/kv_event_sources", kv_event_sources)


def _gated_routes(app: web.Application, state: SimState) -> None:
    async def done(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def tokenizer_info(_: web.Request) -> web.Response:
        return _json({"tokenizer_class": "SimTokenizer", "model_max_length": 0})

    async def fault_status(_: web.Request) -> web.Response:
        return _json({"engines": {"0": "healthy"}, "model": state.model})

    app.router.add_post("/start_profile", done)
    app.router.add_post("/stop_profile", done)
    app.router.add_get("/tokenizer_info", tokenizer_info)
    app.router.add_post("/fault_tolerance/apply", done)
    app.router.add_get("/fault_tolerance/status", fault_status)


def add_vllm_admin_routes(app: web.Application, state: SimState) -> None:
    """Register vLLM's unauthenticated routes for ``state``'s flavour, version and flags, and
    ``POST /sim/sleep`` (``{"level": 0|1|2}``: 0 wakes the engine) for every flavour."""

    async def sim_sleep(request: web.Request) -> web.Response:
        try:
            body = msgspec.json.decode(await request.read() or b"{}")
        except msgspec.DecodeError:
            body = None
        value = body.get("level") if isinstance(body, dict) else None
        level = _level(str(value)) if isinstance(value, int) else None
        if level is None:
            return _bad('body must be {"level": 0, 1 or 2}')
        state.sleep_level = level
        return _json({"sleep_level": level, "sleep_state": SLEEP_STATES[level]})

    async def load(_: web.Request) -> web.Response:
        tracked = state.config.server_load_tracking
        return _json({"server_load": state.engine.load() if tracked else 0})

    app.router.add_post("/sim/sleep", sim_sleep)
    if state.flavor.name != "vllm":
        return
    app.router.add_get("/load", load)
    if state.config.vllm_version != "0.11":
        _elastic_routes(app)
    if state.config.dev_mode:
        _sleep_routes(app, state)
    if state.config.gated_routes:
        _gated_routes(app, state)
