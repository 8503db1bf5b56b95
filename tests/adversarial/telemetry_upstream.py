"""A backend that records what it is sent and answers with hostile strings, as a real process.

``python -m tests.adversarial.telemetry_upstream --port N --record FILE`` answers ``GET`` with
200 (a model list on ``/v1/models``) and each ``POST`` with a chat completion, streamed when
the request asks for it. Every ``POST``'s headers are appended to ``FILE`` as one JSON object
per line (names lower-cased), so a test can read what the gateway propagated upstream.

``--id-bytes`` makes the answer's ``id`` and ``model`` that many characters long (what an
unfamiliar or hostile backend may send; vLLM's are about 40); ``--reasons`` is how many
events of a stream carry a ``finish_reason``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from tests.gateway.raw_upstream import read_request

_MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


def _head(length: int | None, media: bytes = b"application/json") -> bytes:
    size = b"Content-Length: %d" % length if length is not None else b"Transfer-Encoding: chunked"
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s\r\n\r\n" % (media, size)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _answer(name: str) -> bytes:
    body = {
        "id": name,
        "object": "chat.completion",
        "created": 1,
        "model": name,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    data = json.dumps(body).encode()
    return _head(len(data)) + data


def _stream(name: str, reasons: int) -> bytes:
    def event(reason: str | None) -> bytes:
        choice = {"index": 0, "delta": {"content": "x"}, "finish_reason": reason}
        chunk = {"id": name, "object": "chat.completion.chunk", "created": 1, "model": name}
        return b"data: " + json.dumps({**chunk, "choices": [choice]}).encode() + b"\n\n"

    usage = {"prompt_tokens": 5, "completion_tokens": reasons, "total_tokens": 5 + reasons}
    tail = {"id": name, "object": "chat.completion.chunk", "created": 1, "model": name}
    events = [event("stop") for _ in range(reasons)]
    events.append(b"data: " + json.dumps({**tail, "choices": [], "usage": usage}).encode())
    events.append(b"\n\ndata: [DONE]\n\n")
    body = b"".join(_chunk(e) for e in events) + b"0\r\n\r\n"
    return _head(None, b"text/event-stream") + body


def _record(path: str, headers: dict[str, str]) -> None:
    """Append one request's headers (a small local write: the test waits on it anyway)."""
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(json.dumps(headers) + "\n")


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, args: argparse.Namespace
) -> None:
    try:
        while True:
            head, body = await read_request(reader)
            if head.startswith(b"GET"):
                answer = _MODELS if head.split(b" ", 2)[1] == b"/v1/models" else b""
                writer.write(_head(len(answer)) + answer)
                await writer.drain()
                continue
            lines = head.decode("latin-1").split("\r\n")[1:]
            headers = {}
            for line in lines:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            _record(args.record, headers)
            name = "r" * args.id_bytes
            stream = bool(json.loads(body).get("stream"))
            writer.write(_stream(name, args.reasons) if stream else _answer(name))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(args: argparse.Namespace) -> None:
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, args), "127.0.0.1", args.port, limit=1 << 20
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--id-bytes", type=int, default=8)
    parser.add_argument("--reasons", type=int, default=1)
    asyncio.run(_serve(parser.parse_args()))
