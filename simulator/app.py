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
from simulator.vllm_admin import add_vllm_admin_routes, asleep_response

STATE_KEY = web.AppKey("sim_state", SimState)


_UNAUTHORIZED = b'{"error":"Unauthorized"}'


def _api_key_guard(api_keys: tuple[str, ...]) -> Middleware:
    """vLLM's ``--api-key`` (one key or several): only ``/v1/*`` needs one of them; /health,
    /metrics and the routes outside ``/v1`` stay open."""
    expected = [f"Bearer {key}".encode() for key in api_keys]

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith("/v1"):
            given = request.headers.get("Authorization", "").encode()
            # Every key compared, so the time taken does not say which one nearly matched.
            matches = [hmac.compare_digest(given, key) for key in expected]
            if not any(matches):
                return web.Response(body=_UNAUTHORIZED, status=401, content_type=JSON)
        return await handler(request)

    return guard


def build_app(state: SimState) -> web.Application:
    """Create the application serving ``state``."""
    api_keys = state.config.api_keys
    middlewares = [_api_key_guard(api_keys)] if api_keys else []
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
    app[STATE_KEY] = state

    async def chat(request: web.Request) -> web.StreamResponse:
        if state.sleep_level:
            return asleep_response()
        return await handle_completion(request, state, chat=True)

    async def completions(request: web.Request) -> web.StreamResponse:
        if state.sleep_level:
            return asleep_response()
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
    add_vllm_admin_routes(app, state)
    return app
