"""The routes each server flavour adds (health, info, metrics): see ``simulator/flavors.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from simulator.flavor_metrics import RENDERERS
from simulator.flavors import JSON_TYPE, Flavor
from simulator.schemas import encoder
from simulator.state import SimState

Handler = Callable[[web.Request], Awaitable[web.Response]]


def _json(payload: Any) -> Handler:
    """A handler that always answers ``payload`` as JSON."""
    body = encoder.encode(payload)

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type=JSON_TYPE)

    return handle


def _text(text: str, content_type: str = "text/plain") -> Handler:
    """A handler that always answers ``text``."""

    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type=content_type)

    return handle


def _info_routes(app: web.Application, state: SimState, flavor: Flavor) -> None:
    """The routes each server has besides the OpenAI ones (what detection looks at)."""
    model = state.model
    if flavor.name == "sglang":
        info = {"model_path": model, "tokenizer_path": model, "is_generation": True}
        app.router.add_get("/get_model_info", _json(info))
        server = {"model_path": model, "max_running_requests": state.config.max_num_seqs}
        app.router.add_get("/get_server_info", _json(server))
        app.router.add_get("/server_info", _json(server))
    elif flavor.name == "tgi":
        info = {
            "model_id": model,
            "version": "3.3.6",
            "router": "text-generation-router",
            "max_concurrent_requests": state.config.max_num_seqs,
            "max_input_tokens": state.config.max_model_len - 1,
            "max_total_tokens": state.config.max_model_len,
        }
        app.router.add_get("/info", _json(info))
    elif flavor.name == "ollama":
        app.router.add_get("/", _text("Ollama is running"))
        app.router.add_get("/api/version", _json({"version": "0.12.6"}))
        tags = {"models": [{"name": model, "model": model}]}
        app.router.add_get("/api/tags", _json(tags))
    elif flavor.name == "llamacpp":
        props = {"total_slots": state.config.max_num_seqs, "model_path": model}
        app.router.add_get("/props", _json(props))
    elif flavor.name == "llamacpp-python":
        page = "<!DOCTYPE html><title>llama-cpp-python - Swagger UI</title>"
        app.router.add_get("/docs", _text(page, "text/html"))
        schema = {"openapi": "3.1.0", "info": {"title": "🦙 llama.cpp Python API"}}
        app.router.add_get("/openapi.json", _json(schema))


def add_flavor_routes(app: web.Application, state: SimState) -> None:
    """Register the health, metrics and info routes of ``state``'s flavour."""
    flavor = state.flavor
    delay = state.config.health_delay_s
    delay = flavor.health_delay_s if delay is None else delay

    async def health(_: web.Request) -> web.Response:
        if delay:
            await asyncio.sleep(delay)
        if not state.healthy:
            return web.Response(
                status=503,
                body=flavor.error_body(503, "unhealthy"),
                content_type=JSON_TYPE,
                headers={"x-sim-replica": state.replica},
            )
        content_type = JSON_TYPE if flavor.health_body else None
        return web.Response(
            body=flavor.health_body,
            content_type=content_type,
            headers={"x-sim-replica": state.replica},
        )

    async def metrics(_: web.Request) -> web.Response:
        render = RENDERERS[flavor.metrics or "vllm"]
        text = render(
            state.engine.metrics,
            replace(state.engine.gauges(), sleep_level=state.sleep_level),
            state.model,
            legacy=state.config.legacy_metrics,
        )
        return web.Response(
            text=text,
            content_type="text/plain",
            charset="utf-8",
            headers={"x-sim-replica": state.replica},
        )

    if flavor.health_path is not None:
        app.router.add_get(flavor.health_path, health)
    wanted = state.config.metrics
    if flavor.metrics is not None and (
        wanted == "on" or (wanted == "auto" and flavor.metrics_by_default)
    ):
        app.router.add_get("/metrics", metrics)
    _info_routes(app, state, flavor)
