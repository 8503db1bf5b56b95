"""``tiergate serve --workers 2``: the per-tenant shadow cap is the gateway's, divided among
its workers, and each worker counts only the requests it serves. A tenant on one kept-alive
connection reaches one worker and takes that worker's share; spread over new connections it
takes the gateway's cap, and never more (docs/savings.md)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.processes import patience
from tests.stack import Backends, running_stack

pytestmark = pytest.mark.slow
CAP = 4
WORKERS = 2
REQUESTS = 40
COMPARED = 'tiergate_shadow_total{direction="fast_on_precise",outcome="compared"'
SHADOWS = "tiergate_shadow_total{"


def _shadow_everything(config: dict[str, Any], _backends: Backends) -> None:
    config["router"] = {
        "shadow": {
            "fast_ratio": 1.0,
            "max_concurrent": 64,
            "tenant_samples_per_minute": CAP,
        }
    }


def _chat(client: httpx.Client, url: str, i: int) -> None:
    body = {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": f"{i}"}]}
    assert client.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200


def _counts(url: str, decided: int) -> tuple[float, float]:
    """(compared, every outcome) over the group's workers, once ``decided`` were counted."""
    deadline = time.monotonic() + patience(20)
    while True:
        rows = [
            line
            for line in httpx.get(url + "/metrics").text.splitlines()
            if line.startswith(SHADOWS)
        ]
        total = sum(float(line.rsplit(" ", 1)[1]) for line in rows)
        if total >= decided or time.monotonic() > deadline:
            compared = sum(
                float(line.rsplit(" ", 1)[1]) for line in rows if line.startswith(COMPARED)
            )
            return compared, total


def test_one_connection_takes_one_workers_share_and_the_gateway_never_more_than_its_cap() -> None:
    with running_stack(configure=_shadow_everything, workers=WORKERS) as stack:
        url = stack.gateway.url
        with httpx.Client() as client:  # one kept-alive connection: one worker serves it all
            for i in range(REQUESTS):
                _chat(client, url, i)
        compared, total = _counts(url, REQUESTS)
        assert total == REQUESTS
        assert compared == CAP // WORKERS
        for i in range(REQUESTS):  # a new connection each: both workers serve some
            with httpx.Client() as client:
                _chat(client, url, i)
        compared, total = _counts(url, 2 * REQUESTS)
        assert total == 2 * REQUESTS
        assert compared <= CAP
