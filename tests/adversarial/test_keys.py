"""P9, P10, P11 against real `tiergate serve` processes: limits, expiry, key-id timing.

- P9: requests refused before admission (403 tier, 404 model, 400 max_tokens) used to spend
  the key's requests per minute, so 12 x 403 then an allowed request got 429 with rpm 12.
- P10: admin create with ``expires_in_days: 1e308`` used to give 201 and ``expires_at=inf``,
  after which ``tiergate keys list`` crashed.
- P11: unknown key ids used to take ~150 us longer to reject than known ids with a wrong
  secret (one Redis GET each, misses never cached).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from bench.keys.timing import LIMIT_US, Medians, measure
from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.adversarial.keys_stack import (
    ADMIN,
    CHAT,
    bearer,
    keys_cli,
    redis_key,
    start_all,
)
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
RPM = 12
CAP = 64


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    """The redis-server behind the Redis gateway."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A zero-latency fast-tier simulator."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as process:
        yield process


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A key file with one bootstrap key."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    FileKeyStore(path).put_sync(issue_key("boot", KeyPolicy(), now=0.0)[0])
    return path


@pytest.fixture(scope="module")
def gateways(
    redis: RedisServer, sim: SimulatorProcess, keys_file: Path
) -> Iterator[dict[str, GatewayProcess]]:
    """One gateway on Redis keys + Redis limits, one on file keys + memory limits."""
    asyncio.run(redis_key(redis.url))
    tiers = tiers_config([sim.url], ["http://127.0.0.1:9"], max_tokens_cap=CAP)
    common = {"tiers": tiers, "telemetry": {"access_log": False}}
    procs = {
        "redis": GatewayProcess(
            {
                **common,
                "redis": {"url": redis.url},
                "auth": {"store": "redis", "admin_token": ADMIN},
                "ratelimit": {"backend": "redis"},
            }
        ),
        "memory": GatewayProcess(
            {**common, "auth": {"keys_file": str(keys_file), "admin_token": ADMIN}}
        ),
    }
    start_all(list(procs.values()))
    yield procs
    for proc in procs.values():
        proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client with room for concurrent requests."""
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        yield client


async def admin_key(http: httpx.AsyncClient, gateway: GatewayProcess, **spec: object) -> str:
    """A key created through the gateway's admin API."""
    response = await http.post(
        gateway.url + "/admin/keys", json={"tenant": "adv", **spec}, headers=bearer(ADMIN)
    )
    assert response.status_code == 201, response.text
    return str(response.json()["key"])


async def chat(
    http: httpx.AsyncClient, gateway: GatewayProcess, token: str, **body: object
) -> httpx.Response:
    """One chat request with ``body`` overriding the small default."""
    return await http.post(
        gateway.url + "/v1/chat/completions", json={**CHAT, **body}, headers=bearer(token)
    )


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_twelve_403s_then_an_allowed_request_is_200(
    backend: str,
    gateways: dict[str, GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """rpm 12, fast only: 12 x 403 (precise) in a row, then a fast request gets 200."""
    gateway = gateways[backend]
    token = await admin_key(http, gateway, rpm=RPM, tiers=["fast"])
    for _ in range(RPM):
        refused = await chat(http, gateway, token, model="precise")
        assert refused.status_code == 403
    allowed = await chat(http, gateway, token)
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers["x-ratelimit-remaining-requests"] == str(RPM - 1)


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_concurrent_refusals_of_every_kind_spend_no_requests_or_tokens(
    backend: str,
    gateways: dict[str, GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """403, 404 and 400 (max_tokens over the cap) sent at once leave rpm and tpm untouched."""
    gateway = gateways[backend]
    token = await admin_key(http, gateway, rpm=RPM, tpm=100_000, tiers=["fast"])
    twin = await admin_key(http, gateway, rpm=RPM, tpm=100_000, tiers=["fast"])
    kinds: list[dict[str, object]] = [
        {"model": "precise"},
        {"model": "no-such-model"},
        {"max_tokens": CAP + 1},
    ]
    refusals = await asyncio.gather(*(chat(http, gateway, token, **body) for body in kinds * RPM))
    assert sorted({r.status_code for r in refusals}) == [400, 403, 404]
    for refusal in refusals:
        assert set(refusal.json()["error"]) == {"message", "type", "param", "code"}
    used, fresh = await chat(http, gateway, token), await chat(http, gateway, twin)
    assert used.status_code == fresh.status_code == 200
    assert used.headers["x-ratelimit-remaining-requests"] == str(RPM - 1)
    # Tokens drain continuously, so the refunded key may only be ahead of its fresh twin.
    assert int(used.headers["x-ratelimit-remaining-tokens"]) >= int(
        fresh.headers["x-ratelimit-remaining-tokens"]
    )
    statuses = [(await chat(http, gateway, token)).status_code for _ in range(RPM)]
    assert statuses == [200] * (RPM - 1) + [429]


@pytest.mark.parametrize("days", ["1e308", "1e400", "3651", "0", "-1"])
async def test_admin_expiry_is_bounded(
    days: str,
    gateways: dict[str, GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """expires_in_days outside (0, 3650] gets an OpenAI-shaped 400, never 201 with inf."""
    raw = '{"tenant": "adv", "expires_in_days": ' + days + "}"
    for gateway in gateways.values():
        response = await http.post(
            gateway.url + "/admin/keys",
            content=raw,
            headers={**bearer(ADMIN), "content-type": "application/json"},
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert "expires_in_days" in error["message"]


async def test_listing_survives_any_stored_value(
    redis: RedisServer,
    gateways: dict[str, GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """Garbage in Redis (inf expiry, bytes, JSON list): list shows it as damaged, no crash."""
    client = Redis.from_url(redis.url)
    try:
        record = {
            "id": "forever",
            "tenant": "t",
            "digest": "sha256:" + "0" * 64,
            "policy": {"expires_at": 1e308 * 10},
        }
        for key_id, raw in (
            ("forever", json.dumps(record)),
            ("binary", b"\xff\xfe"),
            ("alist", b"[]"),
        ):
            await client.set(f"tiergate:key:{key_id}", raw)
            await client.sadd("tiergate:keys", key_id)
    finally:
        await client.aclose()
    listing = await http.get(gateways["redis"].url + "/admin/keys", headers=bearer(ADMIN))
    assert listing.status_code == 200
    damaged = {item["id"] for item in listing.json()["data"] if item["status"] == "damaged"}
    assert damaged == {"forever", "binary", "alist"}
    done = keys_cli("list", "--redis-url", redis.url)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "forever      damaged" in done.stdout
    forged = "tg-forever-" + "x" * 43
    response = await http.get(gateways["redis"].url + "/v1/models", headers=bearer(forged))
    assert response.status_code == 401  # a damaged record is never served


def test_unknown_key_ids_take_as_long_to_reject_as_wrong_secrets(
    redis: RedisServer,
    gateways: dict[str, GatewayProcess],
) -> None:
    """Medians of 1,000 interleaved 401s: unknown id vs known id + wrong secret within 20 us."""
    record, _ = asyncio.run(redis_key(redis.url))
    gateway = gateways["redis"]
    rounds: list[Medians] = []
    for _ in range(4):  # a shared 2-core machine is noisy: any clean round shows the truth
        rounds.append(measure("127.0.0.1", gateway.port, record.key_id, tries=1000))
        if abs(rounds[-1].gap_us) <= LIMIT_US:
            return
    pytest.fail(
        "medians differ by more than 20 us in every round: "
        + ", ".join(f"{m.unknown_id_us:.0f} vs {m.known_id_us:.0f} us" for m in rounds)
    )
