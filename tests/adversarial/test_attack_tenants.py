"""Attacks between tenants sharing one fleet: two real `tiergate serve` processes, one real
redis-server (keys, limits and usage), two fast-tier simulators that report cached prompt
tokens, a precise one; the official `openai` client as every caller.

A tenant here is careless or hostile, never an operator: it holds one API key of its own (no
concurrency cap, no scopes) and nothing else. What it must not do: read another tenant's
prompts (through the replicas' shared prefix cache), crowd another tenant out of a full tier,
or reach another tenant's state or the operator's surfaces.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from redis.asyncio import Redis

from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import create_key
from policies.principal import KeyPolicy
from tests.adversarial.keys_stack import ADMIN, bearer, start_all
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

# 100 tokens a second of decode: a 200-token answer holds its slot for about two seconds.
FAST_SIM = (
    "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1", "--jitter", "0",
    "--decode-tokens-per-s", "100", "--enable-prompt-tokens-details",
)  # fmt: skip
PRECISE_SIM = ("--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0")
QUEUE_LENGTH = 4
TENANTS = ("acme", "evil", "victim", "acme|fast", "ACME")
# A confidential document one tenant keeps in its system prompt: hundreds of tokens, so the
# replica's prefix cache holds whole blocks of it.
MEMO = "CONFIDENTIAL acme board memo: " + " ".join(f"clause-{i}" for i in range(300))


@dataclass(frozen=True)
class Fleet:
    """The running fleet and one key per tenant."""

    gateways: tuple[GatewayProcess, GatewayProcess]
    redis: RedisServer
    keys: dict[str, str]
    key_ids: dict[str, str]

    def client(self, tenant: str, gateway: int = 0) -> openai.OpenAI:
        """The official client for ``tenant``'s key on one of the gateways."""
        return openai.OpenAI(
            base_url=self.gateways[gateway].url + "/v1",
            api_key=self.keys[tenant],
            max_retries=0,
            timeout=60,
        )


async def _keys(url: str) -> tuple[dict[str, str], dict[str, str]]:
    client = Redis.from_url(url)
    try:
        store = RedisKeyStore(client)
        made = [await create_key(store, t, KeyPolicy(), now=time.time()) for t in TENANTS]
    finally:
        await client.aclose()
    return (
        {t: token for t, (_, token) in zip(TENANTS, made, strict=True)},
        {t: record.key_id for t, (record, _) in zip(TENANTS, made, strict=True)},
    )


def _config(redis: RedisServer, fast: list[str], precise: str) -> dict[str, Any]:
    """Keys, limits and usage in the shared Redis; one slot per fast replica and a short
    queue, no fallback to precise: a flood fills the fast tier at once."""
    tiers = tiers_config(fast, [precise], max_queue_wait_s=30)
    tiers["fast"]["max_concurrency"] = 1
    return {
        "auth": {"store": "redis", "admin_token": ADMIN},
        "ratelimit": {"backend": "redis"},
        "redis": {"url": redis.url},
        "tiers": tiers,
        "queue": {"max_length": QUEUE_LENGTH},
        "router": {"fallback_to_precise": False},
        "telemetry": {"access_log": False},
    }


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Two gateways in front of two fast replicas and one precise, one redis-server."""
    with (
        RedisServer() as redis,
        SimulatorProcess(*FAST_SIM) as fast_a,
        SimulatorProcess(*FAST_SIM) as fast_b,
        SimulatorProcess(*PRECISE_SIM) as precise,
    ):
        keys, key_ids = asyncio.run(_keys(redis.url))
        config = _config(redis, [fast_a.url, fast_b.url], precise.url)
        gateways = (GatewayProcess(config), GatewayProcess(config))
        try:
            start_all(list(gateways))
            for gateway in gateways:
                gateway.wait_until_ready()
            yield Fleet(gateways, redis, keys, key_ids)
        finally:
            for gateway in gateways:
                gateway.stop()


def _memo_chat(question: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": MEMO}, {"role": "user", "content": question}]


def _cached_tokens(answer: Any) -> int:
    details = answer.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def test_a_tenant_cannot_learn_another_tenants_prompt_from_the_prefix_cache(fleet: Fleet) -> None:
    """Tenant evil sends a guess of acme's confidential system prompt through the other
    gateway: the replica's prefix cache must not answer it from acme's blocks (before: 912
    of its prompt tokens came back as cached, the guess confirmed, prefix affinity having
    sent it to the very replica that held acme's prompt); acme's own repeat still hits."""
    acme = fleet.client("acme")
    first = acme.chat.completions.create(
        model="fast", messages=_memo_chat("Summarise."), max_tokens=1
    )
    again = acme.chat.completions.create(model="fast", messages=_memo_chat("Risks?"), max_tokens=1)
    assert _cached_tokens(first) == 0
    assert _cached_tokens(again) > 200  # one tenant still shares its own prefixes
    guess = fleet.client("evil", gateway=1).chat.completions.create(
        model="fast", messages=_memo_chat("What does clause 7 say?"), max_tokens=1
    )
    assert _cached_tokens(guess) == 0, "evil's guess hit acme's cached prompt"
    # Even with the caller's own cache_salt set to the other tenant's name.
    salted = fleet.client("evil").chat.completions.create(
        model="fast",
        messages=_memo_chat("Summarise."),
        max_tokens=1,
        extra_body={"cache_salt": "acme"},
    )
    assert _cached_tokens(salted) == 0


def _metrics(gateway: GatewayProcess) -> str:
    answer = httpx.get(gateway.url + "/metrics", headers=bearer(ADMIN), timeout=5)
    assert answer.status_code == 200
    return answer.text


def _waiting(gateway: GatewayProcess) -> float:
    text = _metrics(gateway)
    found = re.search(r'tiergate_queue_waiting\{tier="fast"\} (\S+)', text)
    assert found is not None
    return float(found.group(1))


async def _post(http: httpx.AsyncClient, url: str, key: str, max_tokens: int) -> httpx.Response:
    body = {
        "model": "fast",
        "messages": [{"role": "user", "content": "write a long story"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return await http.post(url + "/v1/chat/completions", json=body, headers=bearer(key))


async def _flood_then_victim(fleet: Fleet) -> tuple[httpx.Response, list[httpx.Response], float]:
    gateway = fleet.gateways[0]
    async with httpx.AsyncClient(timeout=120) as http:
        # The two slots, then the whole queue, then more: a careless batch job.
        flood = [
            asyncio.create_task(_post(http, gateway.url, fleet.keys["evil"], 200))
            for _ in range(2 + QUEUE_LENGTH + 2)
        ]
        deadline = time.monotonic() + patience(20)
        while await asyncio.to_thread(_waiting, gateway) < QUEUE_LENGTH:
            assert time.monotonic() < deadline, "the flood never filled the queue"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        victim = await _post(http, gateway.url, fleet.keys["victim"], 2)
        waited = time.monotonic() - started
        return victim, list(await asyncio.gather(*flood)), waited


def test_a_tenant_flooding_a_full_tier_does_not_shut_another_tenant_out(fleet: Fleet) -> None:
    """Tenant evil holds every fast slot and fills the fast tier's queue; tenant victim's one
    request must still get a place (fair queuing promises it is served within about one
    turn), not a 503 at once because evil's waiters took every place (before: 503 in 0 s).
    Evil pays with its own newest waiter, and nobody waits past the queue's bound."""
    victim, flood, waited = asyncio.run(_flood_then_victim(fleet))
    assert victim.status_code == 200, (victim.status_code, victim.text)
    assert victim.headers["x-tiergate-tier"] == "fast"
    statuses = sorted(answer.status_code for answer in flood)
    # Two served at once, four from the queue less the one pushed out; the rest refused.
    assert statuses.count(200) == 2 + QUEUE_LENGTH - 1, statuses
    refused = [answer for answer in flood if answer.status_code == 503]
    assert all(answer.json()["error"]["code"] == "overloaded" for answer in refused)
    assert all("retry-after" in answer.headers for answer in refused)
    # One turn: about one answer's time (2 s), well before evil's queued requests are done.
    assert waited < patience(6), waited
    assert _waiting(fleet.gateways[0]) == 0


def test_tenant_state_stays_apart_in_the_shared_redis(fleet: Fleet) -> None:
    """Tenants whose names differ only by case or carry the usage store's separator ("acme",
    "ACME", "acme|fast") keep their own rows in /admin/usage, written by both gateways and
    read on either."""
    for tenant, which, count in (("acme", 0, 1), ("ACME", 1, 2), ("acme|fast", 0, 3)):
        for _ in range(count):
            answer = fleet.client(tenant, which).chat.completions.with_raw_response.create(
                model="precise", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert answer.http_response.status_code == 200
    wanted = {("ACME", fleet.key_ids["ACME"]): 2, ("acme|fast", fleet.key_ids["acme|fast"]): 3}
    for gateway in fleet.gateways:  # each one reports the other's requests too
        deadline = time.monotonic() + patience(10)
        while (seen := _precise_requests(gateway)) != {**seen, **wanted}:
            assert time.monotonic() < deadline, seen  # totals reach Redis within a second
            time.sleep(0.1)
        assert seen[("acme", fleet.key_ids["acme"])] == 1
        tenants = {row["tenant"] for row in _usage(gateway, "tenant")["rows"]}
        assert {"acme", "ACME", "acme|fast"} <= tenants


def _usage(gateway: GatewayProcess, by: str) -> dict[str, Any]:
    answer = httpx.get(
        gateway.url + "/admin/usage",
        params={"window": "1h", "by": by},
        headers=bearer(ADMIN),
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    report: dict[str, Any] = answer.json()
    return report


def _precise_requests(gateway: GatewayProcess) -> dict[tuple[str, str], int]:
    rows = _usage(gateway, "key")["rows"]
    return {(r["tenant"], r["key_id"]): r["requests"] for r in rows if r["tier"] == "precise"}


def test_nothing_a_tenant_sends_reaches_the_operators_metrics(fleet: Fleet) -> None:
    """Values a tenant chooses (model names, request ids, routing headers, user and metadata
    fields) never become label values on /metrics, where an operator reads them as trusted."""
    marker = f"tenantmark{uuid.uuid4().hex[:12]}"
    evil = fleet.keys["evil"]
    url = fleet.gateways[0].url + "/v1/chat/completions"
    sent = [
        ({"model": marker, "messages": [{"role": "user", "content": "hi"}]}, {}),
        (
            {"model": "precise", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
             "user": marker, "metadata": {"team": marker}},
            {"x-request-id": marker, "x-tiergate-tier": marker, "x-tiergate-priority": marker},
        ),
        (
            {"model": "precise", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
             "user": marker},
            {"x-request-id": marker},
        ),
    ]  # fmt: skip
    statuses = [
        httpx.post(url, json=body, headers={**bearer(evil), **headers}, timeout=30).status_code
        for body, headers in sent
    ]
    assert statuses[0] == 404
    assert statuses[1] in {400, 403}
    assert statuses[2] == 200
    for gateway in fleet.gateways:
        assert marker not in _metrics(gateway)
