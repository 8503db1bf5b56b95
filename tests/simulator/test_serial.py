"""``--serial``: one generation at a time, as llama-cpp-python's server runs."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.simulator.procs import SimulatorProcess

BODY = {
    "model": "tiergate-precise",
    "messages": [{"role": "user", "content": "Count slowly."}],
    "max_tokens": 24,
    "min_tokens": 24,
    "stream": True,
}


def _stream_events(url: str) -> list[str]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=BODY, timeout=30) as answer:
        return [line for line in answer.iter_lines() if line.startswith("data: ")]


def _models_soon(url: str, took: list[float]) -> None:
    time.sleep(0.25)
    started = time.monotonic()
    httpx.get(url + "/v1/models", timeout=30)
    took.append(time.monotonic() - started)


@pytest.mark.parametrize("mode", ["wait", "interrupt"])
def test_a_waiting_model_list_waits_or_interrupts_the_stream(mode: str) -> None:
    """``wait``: /v1/models waits for the stream, which ends whole; ``interrupt``: the stream
    ends at once with [DONE] and no finish_reason, and /sim/stats counts it."""
    args = ("--serial", mode, "--profile", "precise", "--latency-scale", "4", "--jitter", "0")
    with SimulatorProcess(*args) as sim:
        took: list[float] = []
        poke = threading.Thread(target=_models_soon, args=(sim.url, took))
        poke.start()
        events = _stream_events(sim.url)
        poke.join()
        stats = httpx.get(sim.url + "/sim/stats").json()
    assert events[-1] == "data: [DONE]"
    finished = '"finish_reason":"length"' in events[-2].replace(" ", "")
    if mode == "wait":
        assert finished
        assert stats["serial_interrupted"] == 0
        assert took[0] > 0.2  # it waited behind the generation
    else:
        assert not finished
        assert stats["serial_interrupted"] == 1
