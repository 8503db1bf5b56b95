"""The optional judge call: the precise simulator grades fast answers with the fixed rubric."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import router_models
from bench.shadow import learn
from policies.judge import RUBRIC
from router_models.training.shadow_train import JUDGE_AT, read_shadow
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess
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
        usage = httpx.get(
            stack.gateway.url + "/admin/usage?window=1h&by=tier",
            headers={"Authorization": f"Bearer {ADMIN}"},
        ).json()
    assert view["judge"] == {"ratio": 1.0, "mean_score": 0.75, "samples": 3}
    # The judge calls are the gateway's own spend too: reported apart from the shadow answers.
    spent = {(r["tier"], r["purpose"]): r["requests"] for r in usage["shadow"]["rows"]}
    assert spent == {("precise", "answer"): 3, ("precise", "judge"): 3}
    assert view["shadow"]["outcomes"]["judge:scored"] == 3
    assert stats["requests_total"] == 6  # three shadows, three judge calls
    assert stats["last_request"]["messages"][0] == {"role": "system", "content": RUBRIC}
    assert "CANDIDATE:\n" in stats["last_request"]["messages"][1]["content"]


def test_judge_scores_from_the_simulator_label_the_stores_prompts(tmp_path: Path) -> None:
    """Weak fast and strong precise simulators, every shadow judged: the store's ``judge`` is
    1.0 (SCORE: 5) where the answers match and below 0.625 where the fast one is wrong, and
    ``read_shadow(label="judge")`` gives the quality file's labels."""
    rows = [{"prompt": f"Name fruit number {i}.", "label": "simple"} for i in range(4)] + [
        {"prompt": f"Prove lemma {i} by induction on n.", "label": "complex"} for i in range(4)
    ]
    labels, store, live = tmp_path / "labels.jsonl", tmp_path / "s.jsonl", tmp_path / "a.npz"
    learn.write_quality_file(rows, labels)
    shutil.copyfile(router_models.DEFAULT_ARTIFACT, live)
    config = learn.shadow_config("", "", store, live, ADMIN, judge_ratio=1.0)
    quality = ("--latency-scale", "0", "--quality-file", str(labels))
    with (
        SimulatorProcess("--model", "tiergate-fast", *quality, "--weak") as fast,
        SimulatorProcess("--model", "tiergate-precise", *quality) as precise,
    ):
        config["tiers"]["fast"]["replicas"] = [fast.url]
        config["tiers"]["precise"]["replicas"] = [precise.url]
        config["router"]["shadow"]["store_prompts"] = True
        with GatewayProcess(config) as gateway:
            assert learn.drive(gateway.url, ADMIN, rows, 40)["compared"] >= 40
            outcomes = routing(gateway)["shadow"]["outcomes"]
    records = [json.loads(line) for line in store.read_text(encoding="utf-8").splitlines()]
    assert outcomes["judge:scored"] == len(records) >= 40
    truth = {r["prompt"]: r["label"] for r in rows}
    for record in records:
        if truth[record["prompt"]] == "simple":
            assert record["judge"] == 1.0 == record["agreement"]
        else:
            assert record["judge"] < JUDGE_AT
            assert record["agreement"] < 0.5
    by_judge = read_shadow([store], label="judge")
    complex_digests = {r["prompt_digest"] for r in records if truth[r["prompt"]] == "complex"}
    assert {d for d, y in zip(by_judge.digests, by_judge.y, strict=True) if y} == complex_digests
