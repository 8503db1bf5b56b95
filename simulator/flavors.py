"""Server flavours: the simulator answering as vLLM, SGLang, llama.cpp, Ollama or TGI would.

The engine, latency model and prefix cache are the same for every flavour; what changes is
what a gateway sees at the edges, as each server's public documentation and source describe:

- ``vllm``: ``/health`` (empty 200); ``vllm:*`` metrics; stream usage on ``include_usage``;
  any request id; ``{"error": {"message", "type", "param", "code"}}``.
- ``sglang``: ``/health`` takes about 1 s (it waits for a one-token generation);
  ``/get_model_info``, ``/get_server_info``; ``sglang:*`` metrics; usage on ``include_usage``;
  flat ``{"object": "error", "message", "type", "param", "code"}``.
- ``llamacpp`` (llama.cpp's llama-server): ``/health`` (``{"status":"ok"}``), ``/props``;
  ``llamacpp:*`` metrics (no labels); usage on ``include_usage``;
  ``{"error": {"code", "message", "type"}}``.
- ``llamacpp-python`` (llama-cpp-python's server): no ``/health`` (404) but ``/docs``; no
  metrics; never a usage chunk in streams; refuses a non-UUID ``x-request-id`` (400).
- ``ollama``: no ``/health``; ``/`` ("Ollama is running"), ``/api/version``, ``/api/tags``; no
  metrics; usage on ``include_usage``.
- ``tgi``: ``/health`` (empty 200), ``/info`` (``model_id``...); ``tgi_*`` metrics (no labels);
  usage on ``include_usage``; ``{"error": "...", "error_type": "validation"}`` and 422 where
  vLLM answers 400.

SGLang (``--enable-metrics``) and llama-server (``--metrics``) serve ``/metrics`` only when
asked, so those flavours do too: ``--metrics on`` (``auto``: the server's default). Mid-stream
errors keep vLLM's event shape for every flavour.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from simulator.flavor_metrics import RENDERERS
from simulator.schemas import ERROR_TYPES, encoder, error_payload

if TYPE_CHECKING:
    from simulator.state import SimState

_JSON = "application/json"
_TGI_ERROR_TYPES = {422: "validation", 424: "generation", 429: "overloaded"}


@dataclass(frozen=True, slots=True)
class Flavor:
    """What one kind of server looks like from outside."""

    name: str
    owned_by: str
    health_path: str | None
    health_body: bytes = b""
    health_delay_s: float = 0.0
    metrics: str | None = None
    metrics_by_default: bool = True  # SGLang and llama-server need a flag for /metrics
    stream_usage: bool = True
    uuid_request_ids: bool = False
    error_shape: str = "openai"

    def status(self, status: int) -> int:
        """The status this server answers where vLLM answers ``status`` (TGI: 422 for 400)."""
        return 422 if status == 400 and self.error_shape == "tgi" else status

    def error_object(self, status: int, message: str, param: str | None = None) -> Any:
        """The error document, in this server's shape (also used inside streams)."""
        if self.error_shape == "tgi":
            return {"error": message, "error_type": _TGI_ERROR_TYPES.get(status, "generation")}
        if self.error_shape == "openai_flat":
            return {"object": "error", "message": message,
                    "type": ERROR_TYPES.get(status, "APIError"), "param": param, "code": status}
        if self.error_shape == "llamacpp":
            kind = "invalid_request_error" if status < 500 else "server_error"
            return {"error": {"code": status, "message": message, "type": kind}}
        return {"error": error_payload(status, message, param)}

    def error_body(self, status: int, message: str, param: str | None = None) -> bytes:
        """An encoded error document."""
        return encoder.encode(self.error_object(status, message, param))

    def refuses_request_id(self, request_id: str | None) -> bool:
        """A server that takes only UUIDs refuses any other ``x-request-id``."""
        if not self.uuid_request_ids or request_id is None:
            return False
        try:
            uuid.UUID(request_id)
        except ValueError:
            return True
        return False


FLAVORS: dict[str, Flavor] = {
    flavor.name: flavor
    for flavor in (
        Flavor("vllm", "vllm", "/health", metrics="vllm"),
        Flavor("sglang", "sglang", "/health", health_delay_s=1.0, metrics="sglang",
               metrics_by_default=False, error_shape="openai_flat"),
        Flavor("llamacpp", "llamacpp", "/health", b'{"status":"ok"}', metrics="llamacpp",
               metrics_by_default=False, error_shape="llamacpp"),
        Flavor("llamacpp-python", "me", None, stream_usage=False, uuid_request_ids=True),
        Flavor("ollama", "library", None),
        Flavor("tgi", "tgi", "/health", metrics="tgi", error_shape="tgi"),
    )
}


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _json(payload: Any) -> Handler:
    """A handler that always answers ``payload`` as JSON."""
    body = encoder.encode(payload)

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type=_JSON)

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
        info = {"model_id": model, "version": "3.3.6", "router": "text-generation-router",
                "max_concurrent_requests": state.config.max_num_seqs,
                "max_input_tokens": state.config.max_model_len - 1,
                "max_total_tokens": state.config.max_model_len}
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


def add_flavor_routes(app: web.Application, state: SimState) -> None:
    """Register the health, metrics and info routes of ``state``'s flavour."""
    flavor = state.flavor
    delay = state.config.health_delay_s
    delay = flavor.health_delay_s if delay is None else delay

    async def health(_: web.Request) -> web.Response:
        if delay:
            await asyncio.sleep(delay)
        if not state.healthy:
            return web.Response(status=503, body=flavor.error_body(503, "unhealthy"),
                                content_type=_JSON, headers={"x-sim-replica": state.replica})
        content_type = _JSON if flavor.health_body else None
        return web.Response(body=flavor.health_body, content_type=content_type,
                            headers={"x-sim-replica": state.replica})

    async def metrics(_: web.Request) -> web.Response:
        render = RENDERERS[flavor.metrics or "vllm"]
        text = render(state.engine.metrics, state.engine.gauges(), state.model,
                      legacy=state.config.legacy_metrics)
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"x-sim-replica": state.replica})

    if flavor.health_path is not None:
        app.router.add_get(flavor.health_path, health)
    wanted = state.config.metrics
    if flavor.metrics is not None and (
        wanted == "on" or (wanted == "auto" and flavor.metrics_by_default)
    ):
        app.router.add_get("/metrics", metrics)
    _info_routes(app, state, flavor)
