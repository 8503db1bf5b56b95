"""Through a real gateway and simulator: a batch tenant's flood does not hold back an
interactive tenant, whose requests are handed the next free slots; the operator sees it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
ADMIN = "fair-queue-admin-token-0000000000000"
FLOOD = 24  # heavy's requests in flight at once, over 2 slots
LIGHT = 6  # light's requests, one after the other


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, GatewayProcess]]:
    """One simulated fast replica with real latencies behind 2 gateway slots; two keys."""
    path: Path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    store = FileKeyStore(path)
    heavy, heavy_key = issue_key("heavy", KeyPolicy(priority="batch"), now=time.time())
    light, light_key = issue_key("light", KeyPolicy(), now=time.time())
    store.put_sync(heavy)
    store.put_sync(light)
    with SimulatorProcess("--profile", "fast", "--model", "tiergate-fast", "--jitter", "0") as sim:
        config = {
            "auth": {"keys_file": str(path), "admin_token": ADMIN},
            "tiers": tiers_config([sim.url], [sim.url], max_concurrency=2, max_queue_wait_s=60),
            "telemetry": {"access_log": False},
        }
        with GatewayProcess(config) as gateway:
            yield heavy_key, light_key, gateway


async def _traffic(gateway: GatewayProcess, heavy_key: str, light_key: str) -> list[Any]:
    heavy = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=heavy_key, max_retries=0)
    light = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=light_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Say something."}]

    async def ask(client: openai.AsyncOpenAI) -> Any:
        return await client.chat.completions.create(
            model="fast", messages=messages, max_tokens=32, timeout=120
        )

    async def light_turns() -> list[Any]:
        await asyncio.sleep(0.3)  # the flood is queued by then
        return [await ask(light) for _ in range(LIGHT)]

    try:
        flood = [asyncio.create_task(ask(heavy)) for _ in range(FLOOD)]
        answers = await light_turns()
        answers += await asyncio.gather(*flood)
    finally:
        await heavy.close()
        await light.close()
    return answers


def test_a_flood_of_batch_requests_waits_behind_interactive_ones(
    stack: tuple[str, str, GatewayProcess],
) -> None:
    """Every request is answered; light waited far less than heavy on average, which the
    admin view and the queue metrics show per tenant and per priority class."""
    heavy_key, light_key, gateway = stack
    answers = asyncio.run(_traffic(gateway, heavy_key, light_key))
    assert len(answers) == FLOOD + LIGHT
    assert all(a.choices[0].message.content for a in answers)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    view = httpx.get(gateway.url + "/admin/queue", headers=auth, timeout=10).json()
    fast = view["tiers"]["fast"]
    assert fast["policy"] == "fair"
    assert fast["waiting"] == 0
    tenants = {row["tenant"]: row for row in fast["top_tenants"]["by_wait"]}
    heavy, light = tenants["heavy"], tenants["light"]
    assert heavy["waits"] >= FLOOD - 4  # all but the first slots' holders queued
    assert light["waits"] == LIGHT  # the flood held both slots each time light asked
    assert light["waited_s"] / light["waits"] < heavy["waited_s"] / heavy["waits"] / 3
    metrics = httpx.get(gateway.url + "/metrics", headers=auth, timeout=10).text
    assert 'tiergate_queue_wait_seconds_count{priority="batch",tier="fast"}' in metrics
    assert "tiergate_queue_waiting" in metrics


def test_the_queue_view_needs_the_admin_token_and_the_header_its_scope(
    stack: tuple[str, str, GatewayProcess],
) -> None:
    """/admin/queue without the admin token is 401; x-tiergate-priority from a key without the
    priority scope is an OpenAI-shaped 403 (the openai client's PermissionDeniedError)."""
    heavy_key, _, gateway = stack
    assert httpx.get(gateway.url + "/admin/queue", timeout=10).status_code == 401
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=heavy_key, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        client.chat.completions.create(
            model="fast",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            extra_headers={"x-tiergate-priority": "interactive"},
        )
    assert caught.value.code == "priority_not_allowed"
    client.close()
