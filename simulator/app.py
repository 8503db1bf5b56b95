"""The aiohttp application: the OpenAI-compatible routes, the flavour's own, and ``/sim/``."""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from simulator.control import add_control_routes
from simulator.flavor_routes import add_flavor_routes
from simulator.responses import models_body
from simulator.serving import JSON, base_headers, handle_completion
from simulator.state import SimState

STATE_KEY = web.AppKey("sim_state", SimState)


_UNAUTHORIZED = b'{"error":"Unauthorized"}'


def _api_key_guard(api_key: str) -> Middleware:
    """vLLM's ``--api-key``: only ``/v1/*`` needs the key; /health, /metrics... stay open."""
    expected = f"Bearer {api_key}"

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith("/v1"):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return web.Response(body=_UNAUTHORIZED, status=401, content_type=JSON)
        return await handler(request)

    return guard


def build_app(state: SimState) -> web.Application:
    """Create the application serving ``state``."""
    api_key = state.config.api_key
    middlewares = [_api_key_guard(api_key)] if api_key else []
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
    app[STATE_KEY] = state

    async def chat(request: web.Request) -> web.StreamResponse:
        return await handle_completion(request, state, chat=True)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await handle_completion(request, state, chat=False)

    async def models(request: web.Request) -> web.Response:
        async with state.serial.hold():  # llama-cpp-python: the model list waits its turn
            pass
        body = models_body(
            state.model, state.created, state.config.max_model_len, owned_by=state.flavor.owned_by
        )
        return web.Response(body=body, content_type=JSON, headers=base_headers(request, state))

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    add_flavor_routes(app, state)
    add_control_routes(app, state)
    return app
