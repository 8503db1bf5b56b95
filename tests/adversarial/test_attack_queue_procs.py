"""Attacks on a full tier's queue through real processes: clients that give up while queued.

One slow fast-tier simulator behind a gateway that allows one request in flight to it and
no fallback, so every other request waits in the fast tier's queue.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.processes import patience
from tests.stack import CHAT_PATH, PRECISE_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow
SLOW_FAST = ("--profile", "fast", "--model", "tiergate-fast")
SLOW_FAST_ARGS = (*SLOW_FAST, "--latency-scale", "5", "--jitter", "0")
LONG = {
    "model": "tiergate-fast",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 400,
    "ignore_eos": True,
}


def _one_slot(config: dict[str, Any], _backends: Backends) -> None:
    for tier in config["tiers"].values():
        tier["max_concurrency"] = 1
        tier["max_queue_wait_s"] = 30.0
    config["router"] = {"fallback_to_precise": False}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The gateway in front of a slow fast tier with one slot."""
    with running_stack(sims=(SLOW_FAST_ARGS, PRECISE_SIM), configure=_one_slot) as stack:
        yield stack


def _gauges(stack: Stack) -> tuple[float, float]:
    """The fast tier's requests in flight and waiters, from the gateway's /metrics."""
    text = httpx.get(stack.gateway.url + "/metrics", timeout=5).text
    flight = re.search(r'tiergate_replica_in_flight\{[^}]*tier="fast"[^}]*\} (\S+)', text)
    waiting = re.search(r'tiergate_queue_waiting\{tier="fast"\} (\S+)', text)
    assert flight is not None
    assert waiting is not None
    return float(flight.group(1)), float(waiting.group(1))


def _settles(stack: Stack, want: tuple[float, float], within_s: float) -> tuple[float, float]:
    deadline = time.monotonic() + patience(within_s)
    seen = _gauges(stack)
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = _gauges(stack)
    return seen


def test_clients_that_give_up_while_queued_free_their_place_and_leak_no_slot(
    stack: Stack,
) -> None:
    """Six clients queue behind a long request and hang up: their places are freed, the
    slot returns to the one configured, and the next request is served by the fast tier."""
    holder = threading.Thread(target=lambda: stack.post(LONG, timeout=120))
    holder.start()
    assert _settles(stack, (1.0, 0.0), 20) == (1.0, 0.0)
    for _ in range(6):
        with pytest.raises(httpx.TimeoutException):
            httpx.post(stack.gateway.url + CHAT_PATH, json=LONG, timeout=0.5)
    assert holder.is_alive()  # the slot is still taken: they did wait in the queue
    # Hung up while queued: no place is kept for a client that is gone.
    assert _settles(stack, (1.0, 0.0), 20) == (1.0, 0.0)
    holder.join(patience(120))
    assert _settles(stack, (0.0, 0.0), 60) == (0.0, 0.0)
    short = {**LONG, "max_tokens": 1}
    answer = stack.post(short, timeout=30)
    assert answer.status_code == 200
    assert answer.headers.get("x-tiergate-tier") == "fast"
    assert _settles(stack, (0.0, 0.0), 20) == (0.0, 0.0)


def test_a_stream_cut_by_its_client_hands_the_slot_to_the_waiter(stack: Stack) -> None:
    """A client reads the first event of a long stream and hangs up while another request
    waits for the tier's one slot: the waiter is served by the fast tier, nothing leaks."""
    answers: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: answers.append(stack.post({**LONG, "max_tokens": 1}, timeout=120))
    )
    with httpx.stream(
        "POST", stack.gateway.url + CHAT_PATH, json={**LONG, "stream": True}, timeout=30
    ) as stream:
        chunks = stream.iter_bytes()  # held: a dropped generator closes the stream at once
        assert next(chunks).startswith(b"data: ")
        waiter.start()
        assert _settles(stack, (1.0, 1.0), 20) == (1.0, 1.0)
    waiter.join(patience(60))
    assert [a.status_code for a in answers] == [200]
    assert answers[0].headers.get("x-tiergate-tier") == "fast"
    assert _settles(stack, (0.0, 0.0), 20) == (0.0, 0.0)
