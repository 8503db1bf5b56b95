"""A backend that quotes the credential it was sent in every error it gives, as a real process.

``python -m tests.adversarial.key_echo_upstream --port N --status 400`` answers ``GET`` with
200 (a model list on ``/v1/models``) and every ``POST`` with ``--status`` and an OpenAI-shaped
error whose message is ``Incorrect API key provided: <the bearer token it got>`` (what some
OpenAI-compatible servers and proxies write back). With ``--status 200`` a ``POST`` is a
200 stream instead: one token, then that error as an in-band event, then ``[DONE]``.

``--shape`` says where and how the token is quoted: ``message`` (as above), ``type`` (in the
error's ``type`` field too), ``escaped`` (every ``/`` written ``\\/``, as PHP's json_encode
does: JSON for the same text) or ``long`` (the message is the request's last message, then
the token: a caller sets where the token falls). ``address`` quotes no token but the backend's
own address instead, as a proxy or a server naming itself does: ``backend <Host> could not
serve http://<Host><path>``. ``content`` (with ``--status 200``) streams the token as the
answer's text instead: ``your key: <token>``, then a final chunk and ``[DONE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

_REASONS = {400: b"Bad Request", 401: b"Unauthorized", 500: b"Internal Server Error"}


def _answer(status: int, body: bytes) -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (status, _REASONS.get(status, b"Error"), len(body)) + body


def _stream(error: bytes, text: str = "x") -> bytes:
    """A 200 stream (closed at its end): one token (``text``), then ``error`` in-band (a final
    chunk when empty), then ``[DONE]``."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    token = json.dumps({**head, "choices": [choice]}, separators=(",", ":")).encode()
    if not error:
        last = {"index": 0, "delta": {}, "finish_reason": "stop"}
        error = json.dumps({**head, "choices": [last]}, separators=(",", ":")).encode()
    body = b"data: " + token + b"\n\ndata: " + error + b"\n\ndata: [DONE]\n\n"
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    return answer % len(body) + body


def _error(sent: str, body: bytes, shape: str, where: tuple[str, str] = ("", "")) -> bytes:
    """The error object quoting ``sent`` in ``shape`` (see the module's docstring)."""
    message = f"Incorrect API key provided: {sent}"
    if shape == "address":
        message = f"backend {where[0]} could not serve http://{where[0]}{where[1]}"
    if shape == "long":
        message = f"{json.loads(body)['messages'][-1]['content']} {sent}"
    error = {
        "message": message,
        "type": f"invalid_api_key: {sent}" if shape == "type" else "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    text = json.dumps({"error": error})
    return (text.replace("/", "\\/") if shape == "escaped" else text).encode()


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, shape: str
) -> None:
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in head[1:] if line)
            }
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            if method != "POST":
                models = {"object": "list", "data": [{"id": "m", "object": "model"}]}
                body = json.dumps(models if path.startswith("/v1/models") else {}).encode()
                writer.write(_answer(200, body))
            else:
                sent = headers.get("authorization", "").removeprefix("Bearer ")
                error = _error(sent, body, shape, (headers.get("host", ""), path))
                if shape == "content":
                    writer.write(_stream(b"", f"your key: {sent}"))
                else:
                    writer.write(_stream(error) if status == 200 else _answer(status, error))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        writer.close()


async def _serve(port: int, status: int, shape: str) -> None:
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, status, shape), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--status", type=int, default=400)
    parser.add_argument(
        "--shape",
        choices=["message", "type", "escaped", "long", "address", "content"],
        default="message",
    )
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.status, args.shape))


if __name__ == "__main__":
    main()
