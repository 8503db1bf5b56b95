"""A tier pointed at another OpenAI-compatible layer: a real LiteLLM proxy and a real
vllm-router, each in front of simulator processes, driven with the official ``openai`` client.

TierGate → peer → simulator, all real processes. Each test holds one of TierGate's promises
against the peer: what ``auto`` detects and how the peer is probed, streams arriving complete
with usage, a stream cut behind the peer reported as cut (never a success), the peer's errors
reaching the caller OpenAI-shaped, and the tier's upstream key never reaching the caller.
The gateways are forked from the pre-imported fork server (``ForkedGateway``): no test here is
about a gateway's start, and each start then costs a fraction of a new interpreter's.
The peers are installed from PyPI, pinned and cached, by the benchmarks' installers
(``tests/integration/peer_procs.py``); where that is impossible the tests skip, saying why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.peer_procs import litellm_proxy, vllm_router
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow  # peers installed from PyPI and process fleets: make test-all, CI

ADMIN = "admin-token-for-peer-backend-tests"
MASTER_KEY = "sk-litellm-master-key-for-tiergate-peer-tests"
FAST, PRECISE = "tiergate-fast", "tiergate-precise"
LONG = 200  # tokens of an answer that is still streaming when its engine is killed


class Engine:
    """A simulator behind a peer that a test may kill and bring back on the same port."""

    def __init__(self, *args: str) -> None:
        self.args = ("--profile", "fast", "--model", FAST, "--jitter", "0", *args)
        self.sim = SimulatorProcess(*self.args).start()
        self.url = self.sim.url

    def revive(self) -> None:
        """Start it again where it was (a crashed engine restarted)."""
        self.sim.stop()
        self.sim = SimulatorProcess(*self.args, "--port", str(self.sim.port)).start()

    def requests(self) -> int:
        """Chat requests the engine received since the last reset."""
        return int(self.sim.stats()["requests_total"])


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """The fast tier's engine: 40 tokens a second, so a long answer streams for seconds."""
    live = Engine("--latency-scale", "1", "--decode-tokens-per-s", "40")
    try:
        yield live
    finally:
        live.sim.stop()


@pytest.fixture(scope="module")
def litellm(engine: Engine) -> Iterator[str]:
    """A LiteLLM proxy (master key, no database) with the engine as its one deployment."""
    with litellm_proxy([engine.url], FAST, MASTER_KEY) as url:
        yield url


@pytest.fixture(scope="module")
def litellm_gw(litellm: str, precise_sim: SimulatorProcess) -> Iterator[GatewayProcess]:
    """A gateway whose fast tier is the LiteLLM proxy (the tier's key: the master key), shared
    by the LiteLLM tests that keep its default config; each counts from what it found."""
    with ForkedGateway(_config([litellm], precise_sim.url, api_key=MASTER_KEY)) as gw:
        yield gw


@pytest.fixture(scope="module")
def router_gw(engine: Engine, precise_sim: SimulatorProcess) -> Iterator[GatewayProcess]:
    """A gateway whose fast tier is a vllm-router in front of the engine, shared by the tests
    that keep its default config."""
    with (
        vllm_router([engine.url]) as router,
        ForkedGateway(_config([router], precise_sim.url)) as gw,
    ):
        yield gw


def _config(fast: list[str], precise: str, **tier: Any) -> dict[str, Any]:
    return {
        "auth": {"enabled": False, "admin_token": ADMIN},
        "health": {"interval_s": 0.2},
        "tiers": {
            "fast": {"model": FAST, "replicas": fast, **tier},
            "precise": {"model": PRECISE, "replicas": [precise]},
        },
    }


def _admin(gw: GatewayProcess, path: str) -> httpx.Response:
    return httpx.get(gw.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)


def _replica(gw: GatewayProcess, tier: str = "fast", index: int = 0) -> dict[str, Any]:
    replica: dict[str, Any] = _admin(gw, "/admin/backends").json()["tiers"][tier]["replicas"][index]
    return replica


def _truncated(gw: GatewayProcess, cause: str) -> float:
    """``tiergate_stream_truncated_total{tier="fast",cause=...}`` now."""
    prefix = f'tiergate_stream_truncated_total{{cause="{cause}",tier="fast"}} '
    for line in _admin(gw, "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return 0.0


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)


def _raw_stream(gw: GatewayProcess, request_id: str, max_tokens: int = 6) -> list[str]:
    """A streamed answer's data lines as the caller's socket got them (include_usage on)."""
    body = {
        "model": "fast",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-request-id": request_id}
    url = gw.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["x-request-id"] == request_id
        assert not [h for h in answer.headers if h.startswith(("x-litellm", "llm_provider"))]
        return [line for line in answer.iter_lines() if line]


def _cut_while_streaming(gw: GatewayProcess, engine: Engine, request_id: str) -> int:
    """Stream a long answer, kill the engine once tokens flow; the chunks the caller got
    before the stream failed (it must fail: an ``APIError``, never a normal end)."""
    got: list[int] = []
    flowing = threading.Event()
    failed: list[BaseException] = []

    def read() -> None:
        stream = _client(gw).chat.completions.create(
            model="fast",
            messages=[{"role": "user", "content": "Write a long story."}],
            max_tokens=LONG,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"min_tokens": LONG},
            extra_headers={"x-request-id": request_id},
        )
        try:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(1)
                    if len(got) == 5:
                        flowing.set()
        except openai.APIError as exc:
            failed.append(exc)
        flowing.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert flowing.wait(patience(20))
    engine.sim.kill()
    reader.join(patience(30))
    assert not reader.is_alive()
    assert failed, f"a stream cut behind the peer ended as a success after {len(got)} chunks"
    assert len(got) < LONG
    return len(got)


# -- LiteLLM ------------------------------------------------------------------------------------


def test_litellm_is_detected_and_probing_it_generates_nothing(
    engine: Engine, litellm_gw: GatewayProcess
) -> None:
    """LiteLLM's ``/health`` (with the master key) runs a completion on every deployment: the
    gateway names the kind and probes ``/health/readiness``, so an idle tier costs nothing."""
    gw = litellm_gw
    gw.wait_until_ready()
    # A cold proxy answers its first requests in seconds: a round or two may pass first.
    deadline = time.monotonic() + patience(10)
    while _replica(gw)["backend"]["kind"] != "litellm" and time.monotonic() < deadline:
        time.sleep(0.1)
    backend = _replica(gw)["backend"]
    assert (backend["kind"], backend["probe_path"]) == ("litellm", "/health/readiness")
    engine.sim.reset()
    rounds = 10  # health.interval_s 0.2: about ten probe rounds
    deadline = time.monotonic() + rounds * 0.2
    while time.monotonic() < deadline:
        assert _replica(gw)["healthy"]
        time.sleep(0.2)
    assert engine.requests() == 0, "health probes made the engine generate"


def test_litellm_streams_arrive_complete_with_usage(litellm_gw: GatewayProcess) -> None:
    """A stream through LiteLLM reaches the caller whole: chunks, the usage it asked for
    (LiteLLM passes ``include_usage`` on), ``[DONE]``; the access line says complete."""
    gw = litellm_gw
    gw.wait_until_ready()
    lines = _raw_stream(gw, "peer-litellm-stream")
    assert lines[-1] == "data: [DONE]"
    assert '"usage"' in lines[-2]
    access = gw.access_of("peer-litellm-stream")
    assert access["outcome"] == "complete"
    assert access["completion_tokens"] > 0


def test_litellm_errors_keep_status_and_shape_and_the_key_never_leaks(
    engine: Engine, litellm: str, precise_sim: SimulatorProcess
) -> None:
    """LiteLLM's 400 is the caller's 400 (OpenAI-shaped, never retried); its 500 a 502. The
    tier's key (LiteLLM's master key) appears in no answer's headers or body."""
    seen: list[str] = []
    config = _config([litellm], precise_sim.url, api_key=MASTER_KEY)
    config["router"] = {"fallback_to_precise": False}
    with ForkedGateway(config) as gw:
        gw.wait_until_ready()
        # Until detection is over: it asks LiteLLM's /health, which runs a completion on the
        # engine, and one landing after the reset below would count as a retry of the 400.
        deadline = time.monotonic() + patience(10)
        while _replica(gw)["backend"]["kind"] != "litellm" and time.monotonic() < deadline:
            time.sleep(0.1)
        for fault, status in (("fail_400", 400), ("fail_500", 502)):
            engine.sim.set_faults(**{fault: 1.0})
            engine.sim.reset()
            try:
                answer = httpx.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": "fast", "messages": [{"role": "user", "content": "hi"}]},
                    timeout=60,
                )
            finally:
                engine.sim.set_faults(**{fault: 0.0})
            error = answer.json()["error"]
            assert answer.status_code == status, answer.text
            assert set(error) == {"message", "type", "param", "code"}
            if status == 400:
                assert engine.requests() == 1  # a 4xx is never retried
            seen.append(answer.text + repr(answer.headers))
        seen.append("".join(_raw_stream(gw, "peer-litellm-key")))
        seen.append(_admin(gw, "/admin/backends").text)
    assert not [text for text in seen if MASTER_KEY in text or MASTER_KEY[-8:] in text]


def test_litellm_stream_cut_by_a_dead_engine_is_an_error_and_counted(
    engine: Engine, litellm_gw: GatewayProcess
) -> None:
    """The engine behind LiteLLM dies mid-stream: LiteLLM sends its own error event; the caller
    gets an error, no ``[DONE]``; the cut is counted, and the tokens it got are charged."""
    gw = litellm_gw
    gw.wait_until_ready()
    cuts = _truncated(gw, "upstream_error")
    try:
        received = _cut_while_streaming(gw, engine, "peer-litellm-cut")
    finally:
        engine.revive()
    access = gw.access_of("peer-litellm-cut")
    assert (access["outcome"], access["stream_cut"]) == ("upstream_error", "upstream_error")
    assert access["completion_tokens"] >= received - 1  # the chunks the caller got
    assert _truncated(gw, "upstream_error") == cuts + 1


# -- vllm-router --------------------------------------------------------------------------------


def test_vllm_router_is_detected_as_vllm_and_streams_arrive_complete(
    router_gw: GatewayProcess,
) -> None:
    """vllm-router passes its worker's ``/metrics`` on, so ``auto`` names it ``vllm``; streams
    arrive whole with usage and ``[DONE]``, and the caller's request id comes back."""
    gw = router_gw
    gw.wait_until_ready()
    backend = _replica(gw)["backend"]
    assert (backend["kind"], backend["probe_path"]) == ("vllm", "/health")
    lines = _raw_stream(gw, "peer-router-stream")
    assert lines[-1] == "data: [DONE]"
    assert '"usage"' in lines[-2]
    assert gw.access_of("peer-router-stream")["outcome"] == "complete"


def test_vllm_router_stream_cut_by_a_dead_engine_is_a_reset(
    engine: Engine, router_gw: GatewayProcess
) -> None:
    """The worker behind vllm-router dies mid-stream: the router just closes the body; the
    caller gets an error and no ``[DONE]``, the cut is counted as a reset."""
    gw = router_gw
    gw.wait_until_ready()
    cuts = _truncated(gw, "reset")
    try:
        received = _cut_while_streaming(gw, engine, "peer-router-cut")
    finally:
        engine.revive()
    access = gw.access_of("peer-router-cut")
    assert (access["outcome"], access["stream_cut"]) == ("upstream_reset", "reset")
    assert access["completion_tokens"] >= received - 1
    assert _truncated(gw, "reset") == cuts + 1


def test_a_router_whose_worker_died_is_ejected_while_its_health_says_ok(
    precise_sim: SimulatorProcess,
) -> None:
    """vllm-router's ``/health`` stays 200 for minutes after its only worker died (its own
    checks run every 60 s by default); the gateway ejects that router on its failures and
    serves the tier from the other router: every caller gets an answer from the fast tier.

    An ejection lasts ``health.eject_base_s`` (2 s by default), then the replica is tried
    again, and this router, whose health still says OK, fails again. On a loaded machine a
    request through the dead router took 3 to 10 s, longer than 2 s: the replica was back
    and failing before the test looked. The ejection here lasts a minute, so every read
    below falls inside it (each asserts so), which is what "no more traffic" is promised for.
    """
    quick = ("--profile", "fast", "--model", FAST, "--latency-scale", "0")
    with (
        SimulatorProcess(*quick) as doomed,
        SimulatorProcess(*quick) as survivor,
        vllm_router([doomed.url]) as lying,
        vllm_router([survivor.url]) as healthy,
        ForkedGateway(_long_ejection(_config([lying, healthy], precise_sim.url))) as gw,
    ):
        gw.wait_until_ready()
        doomed.kill()
        for n in range(40):  # prefix affinity spreads these over both routers
            _ask_fast(gw, f"question {n}")
            if _replica(gw, index=0)["state"] == "ejected":
                break
        assert httpx.get(lying + "/health", timeout=5).status_code == 200  # the router says OK
        dead = _replica(gw, index=0)
        assert dead["state"] == "ejected", dead
        attempts = sum(dead["attempts"].values())
        assert attempts == 5  # health.eject_after failures in a row, then no more traffic
        for n in range(10):
            _ask_fast(gw, f"after {n}")
        after = _replica(gw, index=0)
        assert after["state"] == "ejected", after  # still inside the one ejection
        assert sum(after["attempts"].values()) == attempts


def _long_ejection(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with a first ejection of a minute (``health.eject_base_s``)."""
    config["health"]["eject_base_s"] = 60.0
    return config


def _ask_fast(gw: GatewayProcess, prompt: str) -> None:
    """One small question, answered by the fast tier (never the fallback)."""
    answer = _client(gw).chat.completions.with_raw_response.create(
        model="fast", messages=[{"role": "user", "content": prompt}], max_tokens=4
    )
    assert answer.headers["x-tiergate-tier"] == "fast"
    assert "x-tiergate-fallback-from" not in answer.headers
