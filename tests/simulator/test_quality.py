"""The simulator's quality model: a weak simulator answers 'complex' prompts differently."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from policies.judge import RUBRIC, judge_messages, parse_score
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


def judge(sim: SimulatorProcess, reference: str, candidate: str, *, stream: bool = False) -> str:
    """The simulator's reply to the gateway's judge call (``policies.judge.judge_messages``)."""
    body = {
        "messages": judge_messages("What is two plus two?", reference, candidate),
        "max_tokens": 16,
        "temperature": 0,
        "stream": stream,
    }
    resp = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == 200
    if not stream:
        text: str = resp.json()["choices"][0]["message"]["content"]
        return text
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: {")]
    return "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events)


def test_the_judge_rubric_gets_a_score_graded_by_word_overlap() -> None:
    """Equal answers score 5; others by the share of their words that match in order
    (2 * matched / total); the gateway's parser reads them."""
    with SimulatorProcess("--model", "m", "--latency-scale", "0") as sim:
        base = "one two three four five six seven eight"
        cases = {
            (base, "one  two three four five six seven eight"): "SCORE: 5",  # whitespace only
            (base, "one two three four five six seven"): "SCORE: 4",  # 14/15
            (base, "ONE two three four five six"): "SCORE: 4",  # 12/14, case ignored
            (base, "one two three four"): "SCORE: 3",  # 8/12
            (base, "one two nine ten eleven"): "SCORE: 2",  # 4/13
            (base, "one nine ten eleven"): "SCORE: 1",  # 2/12
            ("", "anything"): "SCORE: 1",
        }
        assert {pair: judge(sim, *pair) for pair in cases} == cases
        assert parse_score(judge(sim, base, base)) == 1.0
        assert judge(sim, base, "one two nine ten eleven", stream=True) == "SCORE: 2"
        # Not the rubric, or the rubric without the answers: an ordinary reply.
        other = [{"role": "system", "content": RUBRIC + " "}, {"role": "user", "content": "x"}]
        plain = {"messages": other, "max_tokens": 12}
        reply = httpx.post(sim.url + "/v1/chat/completions", json=plain, timeout=10).json()
        assert parse_score(reply["choices"][0]["message"]["content"]) is None
        bare = {"messages": [other[0] | {"content": RUBRIC}, other[1]], "max_tokens": 12}
        reply = httpx.post(sim.url + "/v1/chat/completions", json=bare, timeout=10).json()
        assert parse_score(reply["choices"][0]["message"]["content"]) is None
