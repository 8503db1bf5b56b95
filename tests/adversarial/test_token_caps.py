"""P4: a key's token caps cannot be bypassed by leaving out max_tokens or asking for more
completions (n, best_of, list prompts)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess
from tests.simulator.procs import SimulatorProcess
from tests.stack import Backends, running_stack

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Write as much as you can about tiers."}]


@dataclass
class Stack:
    """A real simulator (vLLM-like: no max_tokens runs to the end of the context) and gateway."""

    gateway: GatewayProcess
    sim: SimulatorProcess
    burst_key: str  # max_tokens 256, 3,000 tokens a minute (the issue's key)
    multi_key: str  # max_tokens 256, 1,000 tokens a minute, up to 4 completions a request

    def post(self, path: str, body: dict[str, Any], key: str) -> httpx.Response:
        """POST ``body`` to ``path`` with ``key``."""
        return httpx.post(
            self.gateway.url + path,
            json={"model": "fast", **body},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two keys in a key file, a gateway, and a fast simulator with an 8k context."""
    store = FileKeyStore(tmp_path_factory.mktemp("keys") / "keys.yaml")
    now = time.time()
    burst, burst_key = issue_key("p4", KeyPolicy(max_tokens=256, tpm=3000), now=now)
    multi, multi_key = issue_key("p4", KeyPolicy(max_tokens=256, tpm=1000, max_n=4), now=now)
    store.put_sync(burst)
    store.put_sync(multi)
    sim = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0.2")

    def key_file(config: dict[str, Any], _backends: Backends) -> None:
        del config["telemetry"]  # the access log on, the default
        config["auth"] = {"keys_file": str(store.path)}
        config["tiers"]["precise"]["model"] = "tiergate-fast"

    with running_stack(sims=[(*sim, "--max-model-len", "8192")], configure=key_file) as running:
        yield Stack(running.gateway, running.fast, burst_key, multi_key)


async def _burst(stack: Stack, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        sends = [
            client.post(
                stack.gateway.url + "/v1/chat/completions",
                json={"model": "fast", "messages": CHAT},
                headers={"Authorization": f"Bearer {stack.burst_key}"},
            )
            for _ in range(count)
        ]
        return list(await asyncio.gather(*sends))


def test_burst_without_max_tokens_stays_within_tpm(stack: Stack) -> None:
    """The issue's burst: 20 requests without max_tokens spend at most the key's 3,000 tpm."""
    answers = asyncio.run(_burst(stack, 20))
    served = [r.json()["usage"] for r in answers if r.status_code == 200]
    assert {r.status_code for r in answers} <= {200, 429}
    assert served
    assert max(u["completion_tokens"] for u in served) <= 256
    assert sum(u["total_tokens"] for u in served) <= 3000
    assert stack.sim.stats()["last_request"]["max_tokens"] == 256


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "n": 5}, "n"),
        ("/v1/completions", {"prompt": "hi", "best_of": 5}, "best_of"),
        ("/v1/completions", {"prompt": ["a", "b", "c", "d", "e"]}, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 2}, "prompt"),
    ],
)
def test_more_completions_than_the_key_allows_are_refused(
    stack: Stack,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    """n, best_of and list prompts above the key's max_n: 400 naming the field, not forwarded."""
    before = stack.sim.stats()["requests_total"]
    resp = stack.post(path, body, stack.multi_key)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "n_exceeded"
    assert resp.json()["error"]["param"] == param
    assert stack.sim.stats()["requests_total"] == before


def test_plain_keys_get_one_completion(stack: Stack) -> None:
    """A key without max_n may not ask for n=2 (default: one completion a request)."""
    resp = stack.post("/v1/chat/completions", {"messages": CHAT, "n": 2}, stack.burst_key)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "n"


def test_completions_are_reserved_as_many_times_as_asked(stack: Stack) -> None:
    """n=4 x 256 tokens cannot fit a 1,000-tpm key (429); n=3 fits and is forwarded."""
    before = stack.sim.stats()["requests_total"]
    too_many = stack.post("/v1/chat/completions", {"messages": CHAT, "n": 4}, stack.multi_key)
    assert too_many.status_code == 429
    assert stack.sim.stats()["requests_total"] == before
    fits = stack.post("/v1/chat/completions", {"messages": CHAT, "n": 3}, stack.multi_key)
    # The simulator serves n=1 only: its own 400 shows that the request was forwarded.
    assert fits.status_code == 400
    assert stack.sim.stats()["requests_total"] == before + 1
    assert stack.sim.stats()["last_request"]["max_tokens"] == 256
