"""Failure behaviour end to end: real gateway processes (forked from a pre-imported fork server,
tests/integration/forked_gateway.py) and simulator processes, injected faults."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import free_port, patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-the-fault-tests"
FAULTS_OFF = dict.fromkeys(
    (
        "fail_429",
        "fail_400",
        "fail_404",
        "fail_500",
        "fail_503",
        "fail_refuse",
        "fail_reset",
        "stall_first_byte",
        "stall_mid_stream",
        "drop_mid_stream",
        "error_mid_stream",
    ),
    0.0,
)


def chat(text: str = "hello", **extra: Any) -> dict[str, Any]:
    """A small chat body."""
    return {
        "model": "fast",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        **extra,
    }


def tier(model: str, urls: list[str], **options: Any) -> dict[str, Any]:
    """One tier's settings."""
    return {"model": model, "replicas": urls, **options}


def config(fast: list[str], precise: list[str], **sections: Any) -> dict[str, Any]:
    """Gateway settings: auth off, an admin token, quick health checks."""
    fast_tier = sections.pop("fast_tier", {})
    precise_tier = sections.pop("precise_tier", {})
    return {
        "auth": {"enabled": False, "admin_token": ADMIN},
        "health": {"interval_s": 0.2},
        "tiers": {
            "fast": tier("tiergate-fast", fast, **fast_tier),
            "precise": tier("tiergate-precise", precise, **precise_tier),
        },
        **sections,
    }


def backends(gw: GatewayProcess, client: httpx.Client | None = None) -> dict[str, Any]:
    """GET /admin/backends with the admin token (on ``client``'s connection, if given)."""
    get = client.get if client is not None else httpx.get
    resp = get(gw.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"})
    assert resp.status_code == 200
    data: dict[str, Any] = resp.json()
    return data


def replica_view(
    gw: GatewayProcess,
    sim: SimulatorProcess,
    tier_name: str = "fast",
    client: httpx.Client | None = None,
) -> dict[str, Any]:
    """The admin view of the replica ``sim`` (passive state is per worker: pass one
    keep-alive ``client`` to read the worker that served that client's requests)."""
    for replica in backends(gw, client)["tiers"][tier_name]["replicas"]:
        if replica["replica"] == f"{sim.host}:{sim.port}":
            view: dict[str, Any] = replica
            return view
    raise AssertionError("replica not listed")


def sse_events(raw: bytes) -> list[str]:
    """The data payloads of an SSE body."""
    return [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimulatorProcess, SimulatorProcess, SimulatorProcess]]:
    """Two fast replicas and one precise replica, no latency."""
    fast = "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    with (
        SimulatorProcess(*fast, "--seed", "1") as a,
        SimulatorProcess(*fast, "--seed", "2") as b,
        SimulatorProcess("--profile", "precise", "--latency-scale", "0") as p,
    ):
        yield a, b, p


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def gw(
    request: pytest.FixtureRequest, sims: tuple[SimulatorProcess, ...]
) -> Iterator[GatewayProcess]:
    """A gateway (one, then two workers) over the shared simulators; short fast-tier idle."""
    a, b, p = sims
    timeouts = {"first_byte_s": 2.0, "idle_s": 0.5, "total_s": 10.0}
    settings = config([a.url, b.url], [p.url], fast_tier={"timeouts": timeouts})
    with ForkedGateway(settings, workers=request.param) as gateway:
        yield gateway


@pytest.fixture
def clean(sims: tuple[SimulatorProcess, ...]) -> Iterator[None]:
    """Faults off and counters zeroed before and after the test."""
    for sim in sims:
        sim.set_faults(**FAULTS_OFF, healthy=True)
        sim.reset()
    yield
    for sim in sims:
        sim.set_faults(**FAULTS_OFF, healthy=True)


def test_admin_backends_needs_the_admin_token(gw: GatewayProcess) -> None:
    """/admin/backends refuses a missing or wrong token and names no secret."""
    assert httpx.get(gw.url + "/admin/backends").status_code == 401
    wrong = httpx.get(gw.url + "/admin/backends", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert ADMIN not in wrong.text


def test_admin_backends_shows_every_replica(
    gw: GatewayProcess, sims: tuple[SimulatorProcess, ...]
) -> None:
    """Each replica's state, in-flight, queue, KV usage and counters are visible."""
    view = backends(gw)
    assert view["tiers"]["fast"]["strategy"] == "prefix_affinity"
    replica = view["tiers"]["fast"]["replicas"][0]
    for field in (
        "state",
        "healthy",
        "in_flight",
        "waiting",
        "kv_usage",
        "recent_errors",
        "attempts",
        "consecutive_failures",
    ):
        assert field in replica
    assert {r["state"] for r in view["tiers"]["fast"]["replicas"]} == {"healthy"}


@pytest.mark.usefixtures("clean")
def test_503_is_retried_on_another_replica(
    gw: GatewayProcess, sims: tuple[SimulatorProcess, ...]
) -> None:
    """A replica answering 503 costs retries, never errors, and is ejected after a few."""
    _, b, _ = sims
    b.set_faults(fail_503=1.0)
    attempts = []
    with httpx.Client() as client:  # one connection: one worker's passive state
        for i in range(12):
            resp = client.post(gw.url + "/v1/chat/completions", json=chat(f"question {i}"))
            assert resp.status_code == 200
            attempts.append(int(resp.headers["x-tiergate-attempts"]))
        view = replica_view(gw, b, client=client)
    assert max(attempts) == 2
    assert b.stats()["requests_total"] >= 1
    assert view["attempts"]["status_503"] >= 1
    assert view["state"] == "ejected" or view["consecutive_failures"] > 0


@pytest.mark.usefixtures("clean")
def test_400_is_passed_through_and_never_counts(
    gw: GatewayProcess, sims: tuple[SimulatorProcess, ...]
) -> None:
    """Upstream 400s reach the caller once (no retry) and do not count against health."""
    a, b, _ = sims
    # Earlier tests in this module may have left failures on a replica (the health state
    # belongs to the long-lived gateway), so compare against the state before the 400s.
    # One keep-alive connection: with several workers, every call meets the same one.
    client = httpx.Client()
    before = {sim.port: replica_view(gw, sim, client=client) for sim in (a, b)}
    for sim in (a, b):
        sim.set_faults(fail_400=1.0)
    for i in range(6):
        resp = client.post(gw.url + "/v1/chat/completions", json=chat(f"bad {i}"))
        assert resp.status_code == 400
        assert resp.headers["x-tiergate-attempts"] == "1"
    answered_400 = 0
    for sim in (a, b):
        view = replica_view(gw, sim, client=client)
        assert view["consecutive_failures"] <= before[sim.port]["consecutive_failures"]
        assert view["ejections_total"] == before[sim.port]["ejections_total"]
        answered_400 += view["attempts"].get("status_400", 0) - before[sim.port]["attempts"].get(
            "status_400", 0
        )
    client.close()
    assert answered_400 == 6


@pytest.mark.usefixtures("clean")
def test_stall_mid_stream_ends_with_an_error_event_and_no_done(
    gw: GatewayProcess, sims: tuple[SimulatorProcess, ...]
) -> None:
    """A backend that stalls after the first token: in-band error event, no [DONE], no hang."""
    a, b, _ = sims
    for sim in (a, b):
        sim.set_faults(stall_mid_stream=1.0, stall_seconds=3.0)
    started = time.monotonic()
    body = chat("tell me more", stream=True, max_tokens=12)
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10)
    elapsed = time.monotonic() - started
    events = sse_events(resp.content)
    assert resp.status_code == 200
    assert "[DONE]" not in events
    assert "error" in json.loads(events[-1])
    assert any("choices" in json.loads(e) for e in events[:-1])
    assert elapsed < 2.5


@pytest.mark.usefixtures("clean")
def test_backend_error_event_is_passed_on_without_done(
    gw: GatewayProcess, sims: tuple[SimulatorProcess, ...]
) -> None:
    """vLLM's own in-band error goes to the client once, and the stream has no [DONE]."""
    a, b, _ = sims
    for sim in (a, b):
        sim.set_faults(error_mid_stream=1.0)
    body = chat("and then?", stream=True, max_tokens=12)
    events = sse_events(httpx.post(gw.url + "/v1/chat/completions", json=body).content)
    errors = [e for e in events if e.startswith('{"error"')]
    assert len(errors) == 1
    assert "[DONE]" not in events


SLOW_FAST = "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1"


@pytest.fixture(scope="module")
def survivor() -> Iterator[SimulatorProcess]:
    """The replica that stays up while another is killed: both runs of the test below share
    it (neither reads its counters), each with a victim and a gateway of its own."""
    with SimulatorProcess(*SLOW_FAST, "--seed", "3") as sim:
        yield sim


@pytest.mark.parametrize("workers", [1, 2])
def test_killing_a_replica_mid_run_loses_no_request(
    survivor: SimulatorProcess, workers: int
) -> None:
    """One of two replicas dies mid-run: every non-streaming request still succeeds."""
    a = survivor
    with SimulatorProcess(*SLOW_FAST, "--seed", "4") as b:
        settings = config([a.url, b.url], [a.url])
        with ForkedGateway(settings, workers=workers) as gateway:
            statuses = asyncio.run(_kill_during_load(gateway, b))
            assert statuses == [200] * len(statuses)
            assert len(statuses) == 90
            assert replica_view(gateway, b)["state"] in ("unhealthy", "ejected")


async def _kill_during_load(gateway: GatewayProcess, victim: SimulatorProcess) -> list[int]:
    statuses: list[int] = []

    async def worker(client: httpx.AsyncClient, worker_id: int) -> None:
        for i in range(30):
            body = chat(f"worker {worker_id} request {i}")
            resp = await client.post(gateway.url + "/v1/chat/completions", json=body)
            statuses.append(resp.status_code)

    async def killer() -> None:
        # Mid-run: once the victim has served some requests (counted, not after a fixed 0.4 s).
        deadline = time.monotonic() + patience(10)
        while (await victim.astats())["requests_total"] == 0:
            assert time.monotonic() < deadline, "the victim got no request"
            await asyncio.sleep(0.02)
        victim.kill()

    async with httpx.AsyncClient(timeout=10) as client:
        await asyncio.gather(*(worker(client, w) for w in range(3)), killer())
    return statuses


def test_whole_fast_tier_down_falls_back_to_precise(sims: tuple[SimulatorProcess, ...]) -> None:
    """No fast replica answers: the precise tier serves, and the headers say so and why."""
    _, _, p = sims
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with ForkedGateway(config(dead, [p.url])) as gateway:
        resp = httpx.post(gateway.url + "/v1/chat/completions", json=chat())
        assert resp.status_code == 200
        assert resp.headers["x-tiergate-tier"] == "precise"
        assert resp.headers["x-tiergate-fallback-from"] == "fast"
        assert resp.headers["x-tiergate-fallback-reason"]
        down = httpx.post(gateway.url + "/v1/chat/completions", json=chat(model="fast"))
        assert down.status_code == 200


def test_precise_tier_down_does_not_downgrade_by_default(
    sims: tuple[SimulatorProcess, ...],
) -> None:
    """precise -> fast needs the setting (and a key allowed to downgrade)."""
    a, _, _ = sims
    dead = [f"http://127.0.0.1:{free_port()}"]
    body = {**chat(), "model": "precise"}
    with ForkedGateway(config([a.url], dead)) as gateway:
        resp = httpx.post(gateway.url + "/v1/chat/completions", json=body)
        assert resp.status_code in (502, 503)
        assert resp.json()["error"]["message"]
    downgrade = config([a.url], dead, router={"downgrade_to_fast": True})
    with ForkedGateway(downgrade) as gateway:
        resp = httpx.post(gateway.url + "/v1/chat/completions", json=body)
        assert resp.status_code == 200
        assert resp.headers["x-tiergate-tier"] == "fast"
        assert resp.headers["x-tiergate-fallback-from"] == "precise"


def test_downgrade_needs_the_keys_downgrade_scope(
    sims: tuple[SimulatorProcess, ...], tmp_path: Path
) -> None:
    """With auth on and downgrade_to_fast set, only a key with the `downgrade` scope is served
    by the fast tier when the precise tier is down; any other key gets the precise failure."""
    a, _, _ = sims
    store = FileKeyStore(tmp_path / "keys.yaml")
    plain, plain_key = issue_key("plain", KeyPolicy(), now=time.time())
    allowed, allowed_key = issue_key(
        "may-downgrade", KeyPolicy(scopes=frozenset({"downgrade"})), now=time.time()
    )
    store.put_sync(plain)
    store.put_sync(allowed)
    settings = config(
        [a.url], [f"http://127.0.0.1:{free_port()}"], router={"downgrade_to_fast": True}
    )
    settings["auth"] = {"keys_file": str(store.path), "admin_token": ADMIN}
    body = {**chat(), "model": "precise"}
    with ForkedGateway(settings) as gateway:
        url = gateway.url + "/v1/chat/completions"
        refused = httpx.post(url, json=body, headers={"Authorization": f"Bearer {plain_key}"})
        assert refused.status_code in (502, 503)
        assert "x-tiergate-fallback-from" not in refused.headers
        served = httpx.post(url, json=body, headers={"Authorization": f"Bearer {allowed_key}"})
        assert served.status_code == 200
        assert served.headers["x-tiergate-tier"] == "fast"
        assert served.headers["x-tiergate-fallback-from"] == "precise"


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[SimulatorProcess, GatewayProcess]]:
    """A slow replica (~80 ms a token) behind a gateway whose precise tier takes one request."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-precise", "--latency-scale", "20", "--seed", "5"
    ) as sim:
        settings = config(
            [sim.url], [sim.url], precise_tier={"max_concurrency": 1, "max_queue_wait_s": 0.2}
        )
        with ForkedGateway(settings) as gateway:
            yield sim, gateway


def test_saturation_sheds_with_503_and_retry_after(
    slow: tuple[SimulatorProcess, GatewayProcess],
) -> None:
    """Every slot busy: 503 with Retry-After after the bounded wait, never a hang."""
    _, gateway = slow
    body = {**chat(), "model": "precise", "max_tokens": 20}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            calls = [client.post(gateway.url + "/v1/chat/completions", json=body) for _ in range(4)]
            return list(await asyncio.gather(*calls))

    started = time.monotonic()
    responses = asyncio.run(burst())
    shed = [r for r in responses if r.status_code == 503]
    assert len(shed) == 3
    assert all(r.headers["Retry-After"] == "1" for r in shed)
    assert shed[0].json()["error"]["code"] == "overloaded"
    assert shed[0].json()["error"]["message"] == (
        "The 'precise' tier is at capacity; retry shortly."
    )
    assert time.monotonic() - started < 5.0


def test_client_disconnect_mid_stream_aborts_and_returns_the_lease(
    slow: tuple[SimulatorProcess, GatewayProcess],
) -> None:
    """Leaving mid-stream aborts the engine's request and frees the gateway's slot."""
    sim, gateway = slow
    before = sim.stats()["aborts_total"]
    body = {**chat("a long story please", stream=True, max_tokens=200), "model": "precise"}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())
    deadline = time.monotonic() + patience(5)
    while time.monotonic() < deadline and sim.stats()["aborts_total"] == before:
        time.sleep(0.05)
    assert sim.stats()["aborts_total"] == before + 1
    while time.monotonic() < deadline:
        if replica_view(gateway, sim, "precise")["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert replica_view(gateway, sim, "precise")["in_flight"] == 0


def test_a_full_fast_tier_falls_back_to_precise(sims: tuple[SimulatorProcess, ...]) -> None:
    """Not only a fast tier with no healthy replica: a fast tier that stays full past its queue
    wait also sends the request to precise (fallback reason `overloaded`), `model: fast`
    included. README's model table and docs/api.md say so (they used to name only the first)."""
    _, _, p = sims
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "20", "--seed", "6"
    ) as slow_fast:
        settings = config(
            [slow_fast.url], [p.url], fast_tier={"max_concurrency": 1, "max_queue_wait_s": 0.2}
        )
        with ForkedGateway(settings) as gateway:
            body = chat(max_tokens=20)

            async def burst() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=10) as client:
                    url = gateway.url + "/v1/chat/completions"
                    return list(await asyncio.gather(*(client.post(url, json=body) for _ in "abc")))

            responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200, 200, 200]
    fell_back = [r for r in responses if r.headers.get("x-tiergate-fallback-from") == "fast"]
    assert fell_back, [dict(r.headers) for r in responses]
    for resp in fell_back:
        assert resp.headers["x-tiergate-tier"] == "precise"
        assert resp.headers["x-tiergate-fallback-reason"] == "overloaded"
