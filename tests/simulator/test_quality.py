"""The simulator's quality model: a weak simulator answers 'complex' prompts differently."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.simulator.procs import SimulatorProcess


def answer(sim: SimulatorProcess, prompt: str) -> str:
    """The reply text to ``prompt`` (non-streaming chat)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 12}
    resp = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == 200
    text: str = resp.json()["choices"][0]["message"]["content"]
    return text


def test_weak_and_strong_agree_on_simple_prompts_only(tmp_path: Path) -> None:
    """Same file, same model name: simple prompts get one reply everywhere, complex ones not."""
    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        "\n".join(
            json.dumps(row)
            for row in [
                {"prompt": "What is the capital of France?", "label": "simple"},
                {"prompt": "Prove that there are  infinitely many primes.", "label": "complex"},
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    common = ("--model", "m", "--latency-scale", "0", "--quality-file", str(labels))
    with SimulatorProcess(*common, "--weak") as weak, SimulatorProcess(*common) as strong:
        simple = "What is the capital of France?"
        hard = "Prove that there are infinitely many primes."  # whitespace differs: same prompt
        assert answer(weak, simple) == answer(strong, simple)
        assert answer(strong, simple) == answer(strong, simple)  # deterministic
        assert answer(weak, hard) != answer(strong, hard)
        assert answer(weak, "never labelled") == answer(strong, "never labelled")
