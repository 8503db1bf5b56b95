"""One contract for every way a request comes in (the edge rules of gateway/http/edge.py).

Three inbound implementations serve ``POST /v1/chat/completions``:

- ``native``: ``tiergate serve``, a real process on a real socket; the request is served by
  the native cycle (gateway/http/native.py) straight from the server's own protocol;
- ``litestar``: the same server with the native endpoints off
  (``tests/gateway/litestar_serve.py``): Litestar behind the server's own ASGI cycle
  (gateway/http/asgi.py), on a real socket;
- ``in_process``: Litestar's in-process test client over the same app (what most tests use).

Each rule below is asserted the same way against each: the body limit (413, declared or
counted while chunks arrive), the Authorization merge (two lines: 401, never the first key),
OpenAI-shaped error bytes, and a client that leaves cancelling the backend request (socket
paths: there is no socket to close in process).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
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
SOCKETS = ("native", "litestar")


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


def _in_process(
    stack: Stack, headers: list[tuple[str, str]], body: bytes, *, chunked: bool
) -> Answer:
    """The same request through Litestar's in-process test client."""
    content: Any = (
        iter([body[i : i + 8192] for i in range(0, len(body), 8192)]) if chunked else body
    )
    with TestClient(app=create_app(Settings.model_validate(stack.config))) as client:
        response = client.post(PATH, headers=headers, content=content)
    return Answer(response.status_code, response.headers["content-type"], response.content)


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
@pytest.mark.parametrize("implementation", SOCKETS)
def test_a_client_that_leaves_cancels_the_backend_request(
    stack: Stack, implementation: str, stream: bool
) -> None:
    """Closing the connection mid-generation aborts the request on the engine, once."""
    before = int(stack.sim.stats()["aborts_total"])
    body = _chat(max_tokens=200, stream=stream)
    sock = connect(stack.servers[implementation].port)
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer {stack.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    if stream:  # the stream has begun: the first bytes of the answer are in
        sock.settimeout(patience(10))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    else:  # the engine is generating (the simulator counts it running)
        deadline = time.monotonic() + patience(5.0)
        while stack.sim.stats()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    sock.close()
    assert _wait_for_abort(stack.sim, before) == before + 1
