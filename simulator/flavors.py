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

import uuid
from dataclasses import dataclass
from typing import Any

from simulator.schemas import ERROR_TYPES, encoder, error_payload

JSON_TYPE = "application/json"
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
            return {
                "object": "error",
                "message": message,
                "type": ERROR_TYPES.get(status, "APIError"),
                "param": param,
                "code": status,
            }
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
        Flavor(
            "sglang",
            "sglang",
            "/health",
            health_delay_s=1.0,
            metrics="sglang",
            metrics_by_default=False,
            error_shape="openai_flat",
        ),
        Flavor(
            "llamacpp",
            "llamacpp",
            "/health",
            b'{"status":"ok"}',
            metrics="llamacpp",
            metrics_by_default=False,
            error_shape="llamacpp",
        ),
        Flavor("llamacpp-python", "me", None, stream_usage=False, uuid_request_ids=True),
        Flavor("ollama", "library", None),
        Flavor("tgi", "tgi", "/health", metrics="tgi", error_shape="tgi"),
    )
}
