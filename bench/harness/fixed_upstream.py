"""A minimal fixed-response OpenAI-compatible upstream for benchmarks.

A raw asyncio protocol on uvloop with the httptools parser: every POST answers the same small
chat completion (or the 400 vLLM gives to ``stream_options`` without ``stream: true``),
GET /health answers 200 with an empty body, GET /v1/models lists one model and GET /metrics
exposes idle vLLM gauges. It does as little per request as an HTTP/1.1 keep-alive
server can, so a proxy in front of it is what a benchmark measures.

Run: ``python bench/harness/fixed_upstream.py --port 8001 [--model NAME]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import cast

import httptools
import uvloop


def _response(status: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\n"
        f"content-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: keep-alive\r\n\r\n"
    )
    return head.encode("ascii") + body


_STREAM_OPTIONS_ERROR = {
    "error": {
        "message": "Stream options can only be defined when `stream=True`.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
_STREAM_OPTIONS = b'"stream_options"'


def build_responses(model: str) -> dict[str, bytes]:
    """Pre-render every response this server can send, keyed by route."""
    completion = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from the fixed upstream."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }
    models = {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 1700000000, "owned_by": "bench"}],
    }
    metrics = (
        f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
        f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n'
        f'vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.0\n'
    )
    js = "application/json"
    return {
        "POST": _response("200 OK", json.dumps(completion).encode(), js),
        "/health": _response("200 OK", b"", js),
        "/v1/models": _response("200 OK", json.dumps(models).encode(), js),
        "/metrics": _response("200 OK", metrics.encode(), "text/plain; version=0.0.4"),
        "404": _response("404 Not Found", b'{"error": {"message": "not found"}}', js),
        # What vLLM answers to `stream_options` without `stream: true`: a client error that a
        # gateway passes through (the overhead benchmark's memory phase sends it).
        "400": _response("400 Bad Request", json.dumps(_STREAM_OPTIONS_ERROR).encode(), js),
    }


class RequestProtocol(asyncio.Protocol):
    """An HTTP/1.1 server connection fed to httptools' request parser (closed on a bad request);
    subclasses answer in the parser's callbacks (``on_body``, ``on_message_complete``)."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport implements asyncio.Transport without subclassing it.
        self._transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url


class FixedProtocol(RequestProtocol):
    """One keep-alive HTTP/1.1 connection answering pre-rendered responses."""

    def __init__(self, responses: dict[str, bytes]) -> None:
        super().__init__()
        self._responses = responses
        self._client_error = False

    def on_body(self, body: bytes) -> None:
        if _STREAM_OPTIONS in body and b'"stream":true' not in body.replace(b" ", b""):
            self._client_error = True

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        self._url = b""
        key = "POST" if method == b"POST" else path
        if self._client_error:
            key, self._client_error = "400", False
        payload = self._responses.get(key, self._responses["404"])
        if self._transport is not None:
            self._transport.write(payload)


async def serve(host: str, port: int, model: str) -> None:
    """Listen until cancelled."""
    responses = build_responses(model)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FixedProtocol(responses), host, port, backlog=1024, reuse_address=True
    )
    print(f"fixed upstream listening on http://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Parse arguments and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="tiergate-fast")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.model))


if __name__ == "__main__":
    main()
