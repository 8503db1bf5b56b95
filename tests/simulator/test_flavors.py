"""Simulator flavours: each server's health route, metric names, stream usage, ids, errors."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.simulator.procs import SimulatorFactory, SimulatorProcess

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _get(sim: SimulatorProcess, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(sim.url + path, timeout=10) as response:  # noqa: S310 - local
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _post(
    sim: SimulatorProcess, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(  # noqa: S310 - local http URL built by us
        sim.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - same
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Flavored:
    """One zero-latency simulator per flavour, started on first use, shared by the module."""

    def __init__(self) -> None:
        self.sims: dict[str, SimulatorProcess] = {}

    def __call__(self, flavor: str) -> SimulatorProcess:
        if flavor not in self.sims:
            self.sims[flavor] = SimulatorProcess(
                "--flavor", flavor, "--latency-scale", "0", "--health-delay", "0", "--metrics", "on"
            ).start()
        return self.sims[flavor]


@pytest.fixture(scope="module")
def flavored() -> Iterator[Flavored]:
    """Simulators by flavour name."""
    sims = Flavored()
    yield sims
    for sim in sims.sims.values():
        sim.stop()


@pytest.mark.parametrize(
    ("flavor", "health", "prefix", "owner"),
    [
        ("vllm", 200, "vllm:", "vllm"),
        ("sglang", 200, "sglang:", "sglang"),
        ("llamacpp", 200, "llamacpp:", "llamacpp"),
        ("llamacpp-python", 404, None, "me"),
        ("ollama", 404, None, "library"),
        ("tgi", 200, "tgi_", "tgi"),
    ],
)
def test_health_metrics_and_model_owner(
    flavored: Flavored, flavor: str, health: int, prefix: str | None, owner: str
) -> None:
    """/health, /metrics and /v1/models answer as the real server does."""
    sim = flavored(flavor)
    assert _get(sim, "/health")[0] == health
    status, page = _get(sim, "/metrics")
    if prefix is None:
        assert status == 404
    else:
        assert status == 200
        lines = [line for line in page.decode().splitlines() if not line.startswith("#")]
        assert lines
        assert all(line.startswith(prefix) for line in lines)
    models = json.loads(_get(sim, "/v1/models")[1])
    assert models["data"][0]["owned_by"] == owner


@pytest.mark.parametrize(
    ("flavor", "path", "key"),
    [
        ("sglang", "/get_model_info", "model_path"),
        ("tgi", "/info", "model_id"),
        ("ollama", "/api/version", "version"),
        ("llamacpp", "/props", "total_slots"),
    ],
)
def test_native_routes(flavored: Flavored, flavor: str, path: str, key: str) -> None:
    """Each server's own info route answers JSON with its telltale field."""
    sim = flavored(flavor)
    status, body = _get(sim, path)
    assert status == 200
    assert key in json.loads(body)


def test_sglang_health_takes_a_second(start_simulator: SimulatorFactory) -> None:
    """SGLang's /health waits for a one-token generation: about 1 s by default."""
    sim = start_simulator("--flavor", "sglang", "--latency-scale", "0")
    started = time.monotonic()
    assert _get(sim, "/health")[0] == 200
    assert time.monotonic() - started >= 0.95


def _stream_events(sim: SimulatorProcess, headers: dict[str, str] | None = None) -> list[str]:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    status, raw = _post(sim, body, headers)
    assert status == 200
    return [e for e in raw.decode().split("\n\n") if e.startswith("data: ")]


@pytest.mark.parametrize(
    ("flavor", "usage"),
    [("vllm", True), ("sglang", True), ("llamacpp-python", False), ("tgi", True)],
)
def test_stream_usage(flavored: Flavored, flavor: str, usage: bool) -> None:
    """A usage chunk follows include_usage, except on llama-cpp-python's server."""
    sim = flavored(flavor)
    events = _stream_events(sim, {"X-Request-Id": str(uuid.uuid4())})
    assert events[-1] == "data: [DONE]"
    assert any('"usage"' in e for e in events) is usage


def test_llamacpp_python_refuses_non_uuid_ids(flavored: Flavored) -> None:
    """llama-cpp-python's server answers 400 to an x-request-id that is not a UUID."""
    sim = flavored("llamacpp-python")
    assert _post(sim, CHAT, {"X-Request-Id": "my-id-1"})[0] == 400
    assert _post(sim, CHAT, {"X-Request-Id": str(uuid.uuid4())})[0] == 200


@pytest.mark.parametrize(
    ("flavor", "status", "check"),
    [
        ("vllm", 400, lambda b: b["error"]["type"] == "BadRequestError"),
        ("sglang", 400, lambda b: b["object"] == "error" and b["code"] == 400),
        ("llamacpp", 400, lambda b: b["error"]["code"] == 400 and "message" in b["error"]),
        ("tgi", 422, lambda b: isinstance(b["error"], str) and b["error_type"] == "validation"),
    ],
)
def test_error_shapes(
    flavored: Flavored, flavor: str, status: int, check: Callable[[Any], bool]
) -> None:
    """A bad request gets each server's own error status and body shape."""
    sim = flavored(flavor)
    got, raw = _post(sim, {"messages": []})
    assert got == status
    assert check(json.loads(raw))


@pytest.mark.parametrize(
    ("flavor", "served"), [("vllm", True), ("tgi", True), ("sglang", False), ("llamacpp", False)]
)
def test_metrics_off_where_the_server_needs_a_flag(
    start_simulator: SimulatorFactory, flavor: str, served: bool
) -> None:
    """SGLang and llama-server expose /metrics only when started with their metrics flag."""
    sim = start_simulator("--flavor", flavor, "--latency-scale", "0", "--health-delay", "0")
    assert (_get(sim, "/metrics")[0] == 200) is served
