"""Shadow evaluation end to end: real simulators with a quality model, a real gateway."""

from __future__ import annotations

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
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
ADMIN = "shadow-test-admin-token-000000000000"
SIMPLE = [f"What is the capital of country number {i}?" for i in range(6)]
COMPLEX = [f"Prove step by step that lemma {i} holds for every prime p." for i in range(6)]


class Stack:
    """The gateway, its two simulators, the caller's key and the shadow store."""

    def __init__(
        self,
        gateway: GatewayProcess,
        fast: SimulatorProcess,
        precise: SimulatorProcess,
        key: str,
        store: Path,
    ) -> None:
        self.gateway, self.fast, self.precise, self.key, self.store = (
            gateway,
            fast,
            precise,
            key,
            store,
        )

    def chat(self, prompt: str, model: str = "fast", **extra: Any) -> httpx.Response:
        """One chat request with the caller's key."""
        body = {
            "model": model,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": prompt}],
            **extra,
        }
        return httpx.post(
            self.gateway.url + "/v1/chat/completions",
            json=body,
            timeout=30,
            headers={"Authorization": f"Bearer {self.key}"},
        )

    def routing(self) -> dict[str, Any]:
        """GET /admin/routing."""
        resp = httpx.get(
            self.gateway.url + "/admin/routing", headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert resp.status_code == 200
        data: dict[str, Any] = resp.json()
        return data

    def wait_for(self, samples: int, direction: str = "fast_on_precise") -> dict[str, Any]:
        """Poll /admin/routing until ``samples`` shadows of ``direction`` were compared."""
        deadline = time.monotonic() + patience(30)
        while time.monotonic() < deadline:
            view = self.routing()
            if view["samples"][direction] >= samples:
                return view
            time.sleep(0.1)
        raise AssertionError(f"shadows did not finish: {self.routing()}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Weak fast simulator, strong (and slow) precise one, shadowing every request."""
    tmp = tmp_path_factory.mktemp("shadow")
    labels = tmp / "labels.jsonl"
    labels.write_text(
        "".join(json.dumps({"prompt": p, "label": "simple"}) + "\n" for p in SIMPLE)
        + "".join(json.dumps({"prompt": p, "label": "complex"}) + "\n" for p in COMPLEX),
        encoding="utf-8",
    )
    keys = tmp / "keys.yaml"
    record, key = issue_key("t", KeyPolicy(rpm=40), now=time.time())
    FileKeyStore(keys).put_sync(record)
    store = tmp / "shadow.jsonl"
    quality = ("--quality-file", str(labels))
    weak_fast = (*FAST_SIM, *quality, "--weak")
    slow_precise = ("--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "3")

    def shadow_everything(config: dict[str, Any], _backends: Backends) -> None:
        del config["telemetry"]  # the access log on, the default
        config["auth"] = {"keys_file": str(keys), "admin_token": ADMIN}
        config["router"] = {
            "shadow": {
                "fast_ratio": 1.0,
                "precise_ratio": 1.0,
                "max_concurrent": 64,
                "store": str(store),
            }
        }

    sims = [weak_fast, (*slow_precise, *quality)]
    with running_stack(sims=sims, configure=shadow_everything) as running:
        yield Stack(running.gateway, running.fast, running.precise, key, store)


def test_shadows_measure_agreement_without_delaying_or_charging_the_caller(stack: Stack) -> None:
    """Simple prompts agree, complex ones do not; answers come at fast-tier speed, uncharged."""
    for prompt in SIMPLE:
        started = time.monotonic()
        resp = stack.chat(prompt)
        assert resp.status_code == 200
        assert time.monotonic() - started < 1.0  # the slow precise shadow is not waited for
    view = stack.wait_for(len(SIMPLE))
    assert view["quality_retained"] == 1.0
    for prompt in COMPLEX[:3]:
        assert stack.chat(prompt).status_code == 200
    for prompt in COMPLEX[3:]:  # streams are shadowed too (the gateway collects the answer)
        resp = stack.chat(prompt, stream=True)
        assert resp.status_code == 200
        assert "data: [DONE]" in resp.text
    view = stack.wait_for(len(SIMPLE) + len(COMPLEX))
    assert view["quality_retained"] < 0.75
    assert view["shadow"]["outcomes"]["fast_on_precise:compared"] == len(SIMPLE) + len(COMPLEX)
    assert view["judge"]["samples"] == 0  # the judge call is off by default
    assert not any(k.startswith("judge:") for k in view["shadow"]["outcomes"])
    # 13 caller requests and 12 shadows: the key's rpm of 40 was charged the 13 only (the
    # GCRA refills while the test runs, so at least 27 remain; with shadows it would be 15).
    remaining = stack.chat("one more")
    assert remaining.status_code == 200
    assert int(remaining.headers["x-ratelimit-remaining-requests"]) >= 40 - 13


def test_precise_traffic_is_shadowed_on_fast(stack: Stack) -> None:
    """Precise-routed requests are answered again by fast: over-routing is measured."""
    for prompt in SIMPLE[:3]:
        assert stack.chat(prompt, model="precise").status_code == 200
    view = stack.wait_for(3, "precise_on_fast")
    assert view["fast_agrees_on_precise_traffic"] == 1.0


def test_the_store_and_metrics_hold_no_prompt_text(stack: Stack) -> None:
    """Records carry digests, scores and agreement; /metrics has the agreement summary."""
    before = stack.routing()["samples"]["fast_on_precise"]
    assert stack.chat(SIMPLE[0]).status_code == 200  # its own shadow: runs alone too
    stack.wait_for(before + 1)
    text = stack.store.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines()]
    assert records
    assert {"direction", "agreement", "score", "prompt_digest", "method"} <= set(records[0])
    for prompt in SIMPLE + COMPLEX:
        assert prompt not in text
    metrics = httpx.get(
        stack.gateway.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}
    ).text
    assert 'tiergate_shadow_agreement_count{direction="fast_on_precise"' in metrics
    assert 'tiergate_shadow_total{direction="fast_on_precise",outcome="compared"}' in metrics
