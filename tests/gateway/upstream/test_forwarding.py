"""Forwarding, upstream attempts and the relay in-process, against the simulator on a real port.

No gateway app is built: a Forwarder over the gateway's real upstream client talks to the
simulator's aiohttp app listening on 127.0.0.1, and what forwarding reports comes back as values.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import pytest
from aiohttp import web

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import AttemptEnd, AttemptStart, FailureKind, Outcome, Usage
from gateway.upstream.attempt import AttemptFailed, UpstreamClient, attempt
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from policies.errors import UpstreamUnavailable
from policies.selection import RoundRobin
from simulator.app import build_app
from simulator.faults import FaultRates
from simulator.profiles import FAST
from simulator.state import SimConfig, SimState

PATH = "/v1/chat/completions"


class Recorded:
    """An AttemptEvents listener that keeps what it was told."""

    def __init__(self) -> None:
        self.starts: list[AttemptStart] = []
        self.ends: list[AttemptEnd] = []

    def attempt_started(self, start: AttemptStart) -> Mapping[str, str]:
        """Keep the start; no extra headers."""
        self.starts.append(start)
        return {}

    def attempt_ended(self, end: AttemptEnd) -> None:
        """Keep the end."""
        self.ends.append(end)


async def _simulator(faults: FaultRates | None = None) -> web.AppRunner:
    config = SimConfig(
        profile=FAST,
        model="tiergate-fast",
        replica="sim-1",
        latency_scale=0.01,
        jitter=0.0,
        output_tokens=4,
        faults=faults or FaultRates(),
    )
    runner = web.AppRunner(build_app(SimState(config)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def _url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


def _refusing_url() -> str:
    """A local port nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def simulator() -> AsyncIterator[str]:
    """The simulator's app on a real port; its base URL."""
    runner = await _simulator()
    try:
        yield _url(runner)
    finally:
        await runner.cleanup()


def _forwarder(upstream: UpstreamClient, tiers: dict[str, list[str]]) -> Forwarder:
    routes = {
        name: TierRoute(ReplicaPool(name, urls, 8, 0.1), RoundRobin(), Timeouts(), "tiergate-fast")
        for name, urls in tiers.items()
    }
    return Forwarder(upstream, routes, RetryPolicy(backoff_base_s=0.0))


def _body(*, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def test_a_complete_answer_comes_back_as_values(
    upstream: UpstreamClient, simulator: str
) -> None:
    """One attempt: the answer, its tier, no fallback, and one start and one end reported."""
    forwarder = _forwarder(upstream, {"fast": [simulator]})
    events = Recorded()
    forwarded = await forwarder.forward(PATH, _body(), ["fast"], events=events)
    assert (forwarded.tier, forwarded.fallback_from, forwarded.fallback_reason) == (
        "fast",
        None,
        None,
    )
    raw = forwarded.exchange.opened.body
    assert raw is not None
    assert msgspec.json.decode(raw)["choices"][0]["message"]["content"]
    (start,) = events.starts
    assert (start.tier, start.url, start.strategy) == ("fast", simulator, "round_robin")
    assert len(start.upstream_request_id) == 32
    assert start.prefix_match is None
    (end,) = events.ends
    assert end.failure is None
    assert end.body == raw
    assert end.upstream_s > 0
    assert end.first_chunk_at is None
    assert forwarder.routes["fast"].pool.replicas[0].in_flight == 0


async def test_a_refused_replica_is_retried_on_the_next_and_both_are_reported(
    upstream: UpstreamClient, simulator: str
) -> None:
    """Connection refused is retried elsewhere; the failed attempt's end names its kind."""
    dead = _refusing_url()
    forwarder = _forwarder(upstream, {"fast": [dead, simulator]})
    events = Recorded()
    forwarded = await forwarder.forward(PATH, _body(), ["fast"], events=events)
    assert forwarded.exchange.replica.url == simulator
    assert [s.url for s in events.starts] == [dead, simulator]
    assert events.starts[0].upstream_request_id != events.starts[1].upstream_request_id
    assert [e.failure for e in events.ends] == [FailureKind.CONNECT, None]
    assert forwarder.routes["fast"].pool.replicas[0].outcomes["connect"] == 1


async def test_a_fallback_tier_answer_names_the_tier_asked_and_why(
    upstream: UpstreamClient, simulator: str
) -> None:
    """The first tier cannot connect anywhere: the second answers, the result says so."""
    forwarder = _forwarder(upstream, {"fast": [_refusing_url()], "precise": [simulator]})
    forwarded = await forwarder.forward(PATH, _body(), ["fast", "precise"])
    assert forwarded.tier == "precise"
    assert forwarded.fallback_from == "fast"
    assert forwarded.fallback_reason == UpstreamUnavailable.default_code


async def test_every_tier_failing_raises_the_callers_error(upstream: UpstreamClient) -> None:
    """No tier can connect: one 502 whose message names the tier and its replica (by its
    label, not its address)."""
    dead = _refusing_url()
    forwarder = _forwarder(upstream, {"fast": [dead]})
    with pytest.raises(UpstreamUnavailable) as caught:
        await forwarder.forward(PATH, _body(), ["fast"])
    assert caught.value.status == 502
    assert "replica fast#1: " in caught.value.message
    assert dead.removeprefix("http://") not in caught.value.message


async def test_a_stream_is_relayed_to_done_and_reports_its_usage(
    upstream: UpstreamClient, simulator: str
) -> None:
    """The first event is read in the attempt; the relay ends with [DONE] and the usage."""
    forwarder = _forwarder(upstream, {"fast": [simulator]})
    events = Recorded()
    forwarded = await forwarder.forward(PATH, _body(stream=True), ["fast"], events=events)
    (end,) = events.ends
    assert end.first_chunk_at is not None
    assert end.first_event.startswith(b"data: {")
    closed: list[tuple[str, Usage | None]] = []
    relay = StreamRelay(
        forwarded.exchange,
        strip_usage=True,
        idle_s=5.0,
        on_close=lambda outcome, usage: closed.append((outcome, usage)),
        prompt_tokens=1,
    )
    text = b"".join([chunk async for chunk in relay])
    assert text.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' not in text  # asked for on the caller's behalf: stripped
    ((outcome, usage),) = closed
    assert outcome == Outcome.COMPLETE
    assert usage is not None
    assert usage.completion_tokens == 4
    assert forwarder.routes["fast"].pool.replicas[0].in_flight == 0


async def test_attempt_opens_an_answer_and_turns_an_error_status_into_a_failure(
    upstream: UpstreamClient, simulator: str
) -> None:
    """upstream.attempt alone: a 200 comes back opened, a 503 as a status failure."""
    payload = msgspec.json.encode({**_body(), "model": "tiergate-fast"})
    headers = {"Content-Type": "application/json"}
    opened = await attempt(
        upstream.pool, simulator + PATH, payload, headers, stream=False, timeout_s=5.0
    )
    assert opened.status == 200
    assert opened.body is not None
    assert opened.response is None
    busy = await _simulator(FaultRates(fail_503=1.0))
    try:
        with pytest.raises(AttemptFailed) as caught:
            await attempt(
                upstream.pool, _url(busy) + PATH, payload, headers, stream=False, timeout_s=5.0
            )
    finally:
        await busy.cleanup()
    assert caught.value.kind == "status_503"
    assert caught.value.status == 503
    assert caught.value.counts_against_replica
