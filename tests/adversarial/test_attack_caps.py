"""The tier's ``max_tokens_cap`` bounds what a caller may ask; omitting max_tokens skips it.

vLLM generates up to the context length when a request names no ``max_tokens``; the simulator's
``--output-tokens`` models that reply length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.gateway_proc import GatewayProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
CAP = 32


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    """A fast tier capped at 32 tokens in front of a backend that writes 1,000 by default."""
    sim = (*FAST_SIM, "--output-tokens", "1000", "--max-model-len", "4096")

    def capped(config: dict[str, Any], _backends: Backends) -> None:
        config["tiers"]["fast"]["max_tokens_cap"] = CAP

    with running_stack(sims=[sim], configure=capped) as stack:
        yield stack.gateway


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_without_max_tokens_is_held_to_the_tier_cap(
    gateway: GatewayProcess, stream: bool
) -> None:
    """No max_tokens: the answer is still at most the tier's cap (the gateway should set it)."""
    body = {
        "model": "fast",
        "messages": [{"role": "user", "content": "write a novel"}],
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    resp = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text[:300]
    if stream:
        usage = [line for line in resp.text.splitlines() if '"usage"' in line][-1]
        completion = int(usage.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
    else:
        completion = resp.json()["usage"]["completion_tokens"]
    assert completion <= CAP, f"{completion} tokens generated on a tier capped at {CAP}"
