"""Prefix blocks are hashed only where a replica choice reads them, and still steer it there.

The whole app against real simulator processes: a prefix-affinity tier of two replicas keeps
one conversation family on one replica; a one-replica tier (or a strategy without affinity)
never hashes the prompt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import pytest
from litestar.testing import AsyncTestClient

import gateway.http.upstream_body
from gateway.composition import create_app
from gateway.config.settings import AuthSettings, BalancingSettings, Settings
from gateway.config.tier_settings import TierSettings
from policies.prefix import prefix_blocks
from tests.simulator.procs import SimulatorProcess

UNUSED = "http://127.0.0.1:9"
StrategyName = Literal["round_robin", "least_loaded", "prefix_affinity"]
# Long enough for several prefix blocks, so the family is identified by more than one.
SYSTEM = "You are the support assistant of a bicycle shop. " * 40


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    """Two zero-latency fast-tier simulators."""
    args = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0")
    with SimulatorProcess(*args) as one, SimulatorProcess(*args) as two:
        yield one, two


def _settings(fast: list[str], strategy: StrategyName) -> Settings:
    return Settings(
        tiers={
            "fast": TierSettings(
                model="tiergate-fast", replicas=fast, default_max_tokens=8, strategy=strategy
            ),
            "precise": TierSettings(
                model="tiergate-precise", replicas=[UNUSED], default_max_tokens=8
            ),
        },
        auth=AuthSettings(enabled=False),
        balancing=BalancingSettings(),
    )


class _Counting:
    """Wraps :func:`prefix_blocks` to count the requests whose prompt was hashed."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[int, ...]:
        self.calls += 1
        return prefix_blocks(*args, **kwargs)


def _chat(question: str) -> dict[str, Any]:
    return {
        "model": "fast",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }


async def _send(settings: Settings, count: int) -> None:
    async with AsyncTestClient(app=create_app(settings)) as client:
        for n in range(count):
            resp = await client.post("/v1/chat/completions", json=_chat(f"question {n}?"))
            assert resp.status_code == 200, resp.text


async def test_a_family_stays_on_one_replica_of_a_prefix_affinity_tier(
    sims: tuple[SimulatorProcess, SimulatorProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas, prefix affinity: every request hashed, all of one family on one replica."""
    counting = _Counting()
    monkeypatch.setattr(gateway.http.upstream_body, "prefix_blocks", counting)
    one, two = sims
    one.reset()
    two.reset()
    await _send(_settings([one.url, two.url], "prefix_affinity"), 12)
    served = sorted([one.stats()["requests_total"], two.stats()["requests_total"]])
    assert served == [0, 12]
    assert counting.calls == 12


@pytest.mark.parametrize(
    ("replicas", "strategy"), [(1, "prefix_affinity"), (2, "round_robin"), (2, "least_loaded")]
)
async def test_no_prompt_is_hashed_where_no_choice_reads_the_blocks(
    sims: tuple[SimulatorProcess, SimulatorProcess],
    monkeypatch: pytest.MonkeyPatch,
    replicas: int,
    strategy: StrategyName,
) -> None:
    """One replica, or a strategy without affinity: the requests are served, nothing hashed."""
    counting = _Counting()
    monkeypatch.setattr(gateway.http.upstream_body, "prefix_blocks", counting)
    urls = [sim.url for sim in sims][:replicas]
    for sim in sims:
        sim.reset()
    await _send(_settings(urls, strategy), 6)
    assert sum(sim.stats()["requests_total"] for sim in sims) == 6
    assert counting.calls == 0
