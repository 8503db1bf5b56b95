"""Crafted packaging through a real gateway (issue 34): at most 20 % precise per prefix kind.

The bench's 50 short simple requests (``bench/packaging/run.py``), each wrapped every way, sent
as ``model: auto`` to ``tiergate serve`` with a fixed threshold at the artifact's 30 % point (so
the figure does not depend on the order of requests); the tier is read from the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import router_models
from bench.packaging.run import KINDS, SIMPLE
from tests.integration.gateway_proc import GatewayProcess
from tests.stack import Backends, running_stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fixed_gateway() -> Iterator[GatewayProcess]:
    """Default rules, packaging unwrapped (the default), a fixed threshold."""
    threshold = router_models.load().threshold_for_share(0.3)

    def fixed(config: dict[str, Any], _: Backends) -> None:
        config["router"] = {"threshold": threshold, "online_control": False}

    with running_stack(configure=fixed) as stack:
        yield stack.gateway


async def _routes(url: str, bodies: list[dict[str, Any]]) -> list[tuple[str, str]]:
    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    url + "/v1/chat/completions", json={"model": "auto", "max_tokens": 1, **b}
                )
                for b in bodies
            )
        )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
    return [(a.headers["x-tiergate-tier"], a.headers["x-tiergate-route-reason"]) for a in answers]


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_packaging_buys_the_precise_tier(fixed_gateway: GatewayProcess, kind: str) -> None:
    """Each prefix kind on 50 short simple requests: <= 20 % precise, and none by a rule."""
    routes = asyncio.run(_routes(fixed_gateway.url, [KINDS[kind](p) for p in SIMPLE]))
    share = sum(tier == "precise" for tier, _ in routes) / len(routes)
    print(f"{kind}: {share:.0%} precise")
    assert share <= 0.20
    assert {reason for _, reason in routes} == {"classifier"}
