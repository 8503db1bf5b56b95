"""One contract for every way a request comes in (the edge rules of gateway/http/edge.py).

Three inbound implementations serve ``POST /v1/chat/completions``:

- ``native``: ``tiergate serve``, a real process on a real socket; the request is served by
  the native cycle (gateway/http/native.py) straight from the server's own protocol;
- ``litestar``: the same server with the native endpoints off
  (``tests/gateway/litestar_serve.py``): Litestar behind the server's own ASGI cycle
  (gateway/http/asgi.py), on a real socket;
- ``in_process``: the same app in process (what Litestar's test client runs; the request is
  handed over as ASGI messages, since the client's transport would merge repeated headers).

Each rule below is asserted the same way against each: the body limit (413, declared or
counted while chunks arrive), the Authorization merge (two lines: 401, never the first key),
OpenAI-shaped error bytes, and a client that leaves cancelling the backend request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from litestar.testing import TestClient

from gateway.access.keystore_file import FileKeyStore
from gateway.composition import create_app
from gateway.config.settings import Settings
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.adversarial.rawhttp import connect
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

MAX_BODY = 65536
PATH = "/v1/chat/completions"
IMPLEMENTATIONS = ("native", "litestar", "in_process")


@dataclass(frozen=True)
class Answer:
    """What a client got: status, content type and body."""

    status: int
    content_type: str
    body: bytes

    def error(self) -> dict[str, Any]:
        """The OpenAI error envelope's inner object (fails if the body is not one)."""
        envelope = json.loads(self.body)
        assert set(envelope) == {"error"}, envelope
        error: dict[str, Any] = envelope["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        return error


@dataclass
class Stack:
    """The simulator, a key, the config, and the two servers on real sockets."""

    sim: SimulatorProcess
    key: str
    config: dict[str, Any]
    servers: dict[str, GatewayProcess]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One slow simulator (time to leave mid-request), a key file, both socket servers."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    record, key = issue_key("edge", KeyPolicy(), now=time.time())
    FileKeyStore(path).put_sync(record)
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "20", "--seed", "5"
    ) as sim:
        config = {
            "auth": {"keys_file": str(path)},
            "server": {"max_body_bytes": MAX_BODY},
            "tiers": tiers_config([sim.url], [sim.url]),
        }
        with (
            GatewayProcess(config) as native,
            GatewayProcess(config, module="tests.gateway.litestar_serve") as litestar,
        ):
            yield Stack(sim, key, config, {"native": native, "litestar": litestar})


def _over_socket(
    port: int, headers: list[tuple[str, str]], body: bytes, *, chunked: bool
) -> Answer:
    """One request on a fresh connection; the answer read until the server closes."""
    head = [f"POST {PATH} HTTP/1.1", "Host: edge", "Connection: close"]
    head += [f"{name}: {value}" for name, value in headers]
    if chunked:
        head.append("Transfer-Encoding: chunked")
        pieces = [body[i : i + 8192] for i in range(0, len(body), 8192)]
        payload = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    else:
        head.append(f"Content-Length: {len(body)}")
        payload = body
    sock = connect(port)
    sock.settimeout(patience(10))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused early
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return _parse(received)


def _parse(raw: bytes) -> Answer:
    """A Content-Length answer from raw bytes."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    fields = {name.lower(): value for name, value in fields.items()}
    length = int(fields["content-length"])
    return Answer(int(lines[0].split()[1]), fields["content-type"], body[:length])


Leave = Callable[[list[dict[str, Any]]], Awaitable[None]]


def _in_process(
    stack: Stack,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    chunked: bool,
    leave: Leave | None = None,
) -> Answer:
    """The same request handed to the app in process, as ASGI messages (in the test client's
    event loop, after its start-up). Not through ``client.post``: the test client's transport
    merges repeated header lines into one before the app sees them. Once the body is read,
    ``receive`` waits as a connected client does; with ``leave``, until it returns, and then
    the client is gone (``http.disconnect``)."""
    raw = [(name.lower().encode(), value.encode()) for name, value in headers]
    if not chunked:
        raw.append((b"content-length", str(len(body)).encode()))
    pieces = [body[i : i + 8192] for i in range(0, len(body), 8192)] or [b""]
    messages = [
        {"type": "http.request", "body": piece, "more_body": n < len(pieces) - 1}
        for n, piece in enumerate(pieces)
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 1),
        "server": ("edge", 80),
    }
    sent: list[dict[str, Any]] = []
    app = create_app(Settings.model_validate(stack.config))

    async def call() -> None:
        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            if leave is None:
                await asyncio.Event().wait()  # a client that stays: until cancelled
            else:
                await leave(sent)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)  # type: ignore[arg-type]  # plain ASGI dicts

    with TestClient(app=app) as client:
        client.blocking_portal.call(call)
    start = sent[0]
    fields = {name.decode(): value.decode() for name, value in start["headers"]}
    body_out = b"".join(m.get("body", b"") for m in sent[1:])
    return Answer(start["status"], fields["content-type"], body_out)


def send(
    stack: Stack,
    implementation: str,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    chunked: bool = False,
) -> Answer:
    """Send one chat request through ``implementation``."""
    headers = [("Content-Type", "application/json"), *headers]
    if implementation == "in_process":
        return _in_process(stack, headers, body, chunked=chunked)
    return _over_socket(stack.servers[implementation].port, headers, body, chunked=chunked)


def _chat(**fields: Any) -> bytes:
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return json.dumps({**body, **fields}).encode()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_key_answers(stack: Stack, implementation: str) -> None:
    """The baseline each rule departs from: one Authorization line with the key is served."""
    answer = send(stack, implementation, [("Authorization", f"Bearer {stack.key}")], _chat())
    assert answer.status == 200, answer
    assert json.loads(answer.body)["object"] == "chat.completion"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_two_authorization_lines_are_merged_and_refused(stack: Stack, implementation: str) -> None:
    """The key twice, or the key and another: merged with ", " (RFC 9110 5.3), which no key
    matches: 401, whichever line comes first."""
    for second in (stack.key, "tg-other"):
        headers = [("Authorization", f"Bearer {stack.key}"), ("Authorization", f"Bearer {second}")]
        answer = send(stack, implementation, headers, _chat())
        assert answer.status == 401, answer
        assert answer.content_type == "application/json"
        error = answer.error()
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_body_over_the_limit_is_413(stack: Stack, implementation: str, chunked: bool) -> None:
    """Over ``max_body_bytes``: 413, OpenAI-shaped, whether the length was declared or counted
    while chunks arrived; the key is valid, so nothing else refuses it."""
    body = _chat(messages=[{"role": "user", "content": "x" * (2 * MAX_BODY)}])
    auth = [("Authorization", f"Bearer {stack.key}")]
    answer = send(stack, implementation, auth, body, chunked=chunked)
    assert answer.status == 413, answer
    assert answer.content_type == "application/json"
    error = answer.error()
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "The request body is too large."


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_error_bytes_are_the_same_everywhere(stack: Stack, implementation: str) -> None:
    """Malformed JSON, an unknown model and a wrong type: the same status, content type and
    envelope (type and code) on every path."""
    auth = [("Authorization", f"Bearer {stack.key}")]
    cases = [
        (b'{"model": "fast", "messages": [', 400),
        (_chat(model="no-such-model"), 404),
        (_chat(temperature="hot"), 400),
    ]
    seen = []
    for body, status in cases:
        answer = send(stack, implementation, auth, body)
        assert answer.status == status, answer
        assert answer.content_type == "application/json"
        error = answer.error()
        seen.append((answer.status, error["type"], error["code"], error["param"]))
    expected = [
        (400, "invalid_request_error", "invalid_json", None),
        (404, "invalid_request_error", "model_not_found", "model"),
        (400, "invalid_request_error", None, "temperature"),
    ]
    assert seen == expected


def _wait_for_abort(sim: SimulatorProcess, before: int) -> int:
    deadline = time.monotonic() + patience(5.0)
    while time.monotonic() < deadline:
        stats = sim.stats()
        if stats["aborts_total"] > before and stats["running"] == 0:
            return int(stats["aborts_total"])
        time.sleep(0.05)
    return int(sim.stats()["aborts_total"])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_client_that_leaves_cancels_the_backend_request(
    stack: Stack, implementation: str, stream: bool
) -> None:
    """Leaving mid-stream (after the first bytes) or mid-generation (the engine counts it
    running) aborts the request on the engine, once."""
    before = int(stack.sim.stats()["aborts_total"])
    body = _chat(max_tokens=200, stream=stream)
    auth = [("Authorization", f"Bearer {stack.key}"), ("Content-Type", "application/json")]
    if implementation == "in_process":
        _in_process(stack, auth, body, chunked=False, leave=_leave_when(stack.sim, stream))
    else:
        _leave_socket(stack, implementation, auth, body, stream=stream)
    assert _wait_for_abort(stack.sim, before) == before + 1


def _leave_when(sim: SimulatorProcess, stream: bool) -> Leave:
    """When an in-process client leaves: after the first body bytes, or once generating."""

    async def leave(sent: list[dict[str, Any]]) -> None:
        deadline = time.monotonic() + patience(10.0)
        while time.monotonic() < deadline:
            if stream and any(m["type"] == "http.response.body" for m in sent):
                return
            if not stream and (await asyncio.to_thread(sim.stats))["running"]:
                return
            await asyncio.sleep(0.02)

    return leave


def _leave_socket(
    stack: Stack, implementation: str, headers: list[tuple[str, str]], body: bytes, *, stream: bool
) -> None:
    """The same over a socket: read the first bytes, or wait until generating, then close."""
    sock = connect(stack.servers[implementation].port)
    head = [f"POST {PATH} HTTP/1.1", "Host: edge", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    if stream:
        sock.settimeout(patience(10))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    else:
        deadline = time.monotonic() + patience(5.0)
        while stack.sim.stats()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    sock.close()
