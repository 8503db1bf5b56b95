"""The cache_salt the gateway forwards: the tenant's (``requests.prefix_cache_scope: tenant``,
the default) or the caller's as sent (``shared``), read back from a real simulator's prefix
cache: a prompt asked again straight at the replica hits its blocks only under the salt the
gateway really sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest
from litestar.testing import AsyncTestClient

from gateway.composition import create_app
from gateway.config.settings import AuthSettings, RequestSettings, Settings
from gateway.config.tier_settings import TierSettings
from policies.prefix import tenant_cache_salt
from policies.principal import DEVELOPMENT_PRINCIPAL
from tests.simulator.procs import SimulatorProcess

UNUSED = "http://127.0.0.1:9"
PROMPT = "The shop's return policy, in full: " + " ".join(f"rule-{i}" for i in range(200))


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A zero-latency fast-tier simulator that reports cached prompt tokens."""
    args = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0")
    with SimulatorProcess(*args, "--enable-prompt-tokens-details") as sim:
        yield sim


def _settings(url: str, scope: Literal["tenant", "shared"]) -> Settings:
    return Settings(
        tiers={
            "fast": TierSettings(model="tiergate-fast", replicas=[url]),
            "precise": TierSettings(model="tiergate-precise", replicas=[UNUSED]),
        },
        auth=AuthSettings(enabled=False),
        requests=RequestSettings(prefix_cache_scope=scope),
    )


def _body(model: str, salt: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "cache_salt": salt,
    }


def _cached(answer: dict[str, Any]) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _direct(sim: SimulatorProcess, salt: str) -> int:
    """Cached prompt tokens of the same prompt sent straight to the replica with ``salt``."""
    answer = httpx.post(sim.url + "/v1/chat/completions", json=_body("tiergate-fast", salt))
    assert answer.status_code == 200, answer.text
    return _cached(answer.json())


@pytest.mark.parametrize("scope", ["tenant", "shared"])
async def test_the_forwarded_salt_is_the_tenants_unless_the_cache_is_shared(
    sim: SimulatorProcess, scope: Literal["tenant", "shared"]
) -> None:
    """``tenant``: the replica cached the prompt under the tenant's salt, not the caller's;
    ``shared``: under the caller's salt as sent."""
    caller = f"caller-salt-{scope}"
    async with AsyncTestClient(app=create_app(_settings(sim.url, scope))) as client:
        answer = await client.post("/v1/chat/completions", json=_body("fast", caller))
        assert answer.status_code == 200, answer.text
    tenants = tenant_cache_salt(DEVELOPMENT_PRINCIPAL.tenant, caller)
    forwarded, other = (tenants, caller) if scope == "tenant" else (caller, tenants)
    assert _direct(sim, other) == 0
    assert _direct(sim, forwarded) > 100
