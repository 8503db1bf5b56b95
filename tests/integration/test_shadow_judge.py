"""The optional judge call: the precise simulator grades fast answers with the fixed rubric."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from policies.judge import RUBRIC
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience
from tests.stack import FAST_SIM, PRECISE_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
ADMIN = "shadow-judge-admin-token-00000000000000"


def routing(gateway: GatewayProcess) -> dict[str, Any]:
    """GET /admin/routing."""
    resp = httpx.get(gateway.url + "/admin/routing", headers={"Authorization": f"Bearer {ADMIN}"})
    assert resp.status_code == 200
    data: dict[str, Any] = resp.json()
    return data


def _judge_everything(config: dict[str, Any], _: Backends) -> None:
    config["auth"]["admin_token"] = ADMIN
    config["router"] = {"shadow": {"fast_ratio": 1.0, "judge_ratio": 1.0}}


def test_judged_shadows_carry_the_precise_tiers_rubric_score() -> None:
    """With judge_ratio 1, each fast shadow is graded once; 'SCORE: 4' reads as 0.75."""
    judge_sim = (*PRECISE_SIM, "--label", "SCORE: 4")
    with running_stack(sims=(FAST_SIM, judge_sim), configure=_judge_everything) as stack:
        body = {"model": "fast", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi?"}]}
        for _ in range(3):
            assert stack.post(body).status_code == 200
        deadline = time.monotonic() + patience(20)
        while routing(stack.gateway)["judge"]["samples"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        view = routing(stack.gateway)
        stats = stack.precise.stats()
    assert view["judge"] == {"ratio": 1.0, "mean_score": 0.75, "samples": 3}
    assert view["shadow"]["outcomes"]["judge:scored"] == 3
    assert stats["requests_total"] == 6  # three shadows, three judge calls
    assert stats["last_request"]["messages"][0] == {"role": "system", "content": RUBRIC}
    assert "CANDIDATE:\n" in stats["last_request"]["messages"][1]["content"]
