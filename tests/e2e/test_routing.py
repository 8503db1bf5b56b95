"""Tier routing with real backends: the response headers and the backends' own access logs agree."""

from __future__ import annotations

import time

import openai
import pytest

from tests.e2e.conftest import FAST_MODEL, PRECISE_MODEL
from tests.e2e.llama_server import LlamaServer

SIMPLE = "Hi! How are you today?"
COMPLEX = (
    "Solve this step by step and prove each step: a train leaves at 3 pm at 80 km/h and a "
    "second one follows on the same track at 4 pm at 100 km/h. When and where does the second "
    "catch up? Then write a Python function `def catch_up(v1, v2, delay_h)` that computes it, "
    "with type hints, a docstring and pytest unit tests covering edge cases such as equal "
    "speeds, and explain the algorithm's complexity."
)


def served_requests(server: LlamaServer) -> int:
    """How many chat requests the real server has logged so far."""
    return server.log_text().count('"POST /v1/chat/completions HTTP/1.1"')


def wait_for_count(server: LlamaServer, expected: int, timeout: float = 5.0) -> int:
    """Poll the server's log until it has logged ``expected`` chat requests."""
    deadline = time.monotonic() + timeout
    count = served_requests(server)
    while count < expected and time.monotonic() < deadline:
        time.sleep(0.1)
        count = served_requests(server)
    return count


@pytest.mark.parametrize(
    ("prompt", "tier"), [(SIMPLE, "fast"), (COMPLEX, "precise")], ids=["simple", "complex"]
)
def test_auto_sends_each_prompt_to_its_tier(
    client: openai.OpenAI,
    fast_server: LlamaServer,
    precise_server: LlamaServer,
    prompt: str,
    tier: str,
) -> None:
    """model=auto: a simple prompt lands on the fast server, a complex one on the precise one."""
    servers = {"fast": fast_server, "precise": precise_server}
    before = {name: served_requests(server) for name, server in servers.items()}
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=8,
    )
    headers = raw.http_response.headers
    assert headers["x-tiergate-tier"] == tier
    assert headers["x-tiergate-route-reason"] == "classifier"
    assert raw.parse().model == (FAST_MODEL if tier == "fast" else PRECISE_MODEL)
    assert wait_for_count(servers[tier], before[tier] + 1) == before[tier] + 1
    other = "precise" if tier == "fast" else "fast"
    assert served_requests(servers[other]) == before[other]


@pytest.mark.parametrize(
    ("model", "tier"),
    [("fast", "fast"), ("precise", "precise"), (FAST_MODEL, "fast"), (PRECISE_MODEL, "precise")],
)
def test_explicit_names_force_the_tier(
    client: openai.OpenAI,
    fast_server: LlamaServer,
    precise_server: LlamaServer,
    model: str,
    tier: str,
) -> None:
    """A tier name or served name forces that tier, even for a prompt auto would send elsewhere."""
    server = fast_server if tier == "fast" else precise_server
    before = served_requests(server)
    prompt = COMPLEX if tier == "fast" else SIMPLE
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=4
    )
    assert raw.http_response.headers["x-tiergate-tier"] == tier
    assert raw.http_response.headers["x-tiergate-route-reason"] == "explicit"
    assert wait_for_count(server, before + 1) == before + 1
