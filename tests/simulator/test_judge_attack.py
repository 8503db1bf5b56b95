"""Attack findings on the simulator's judge (simulator/judge.py): each test states what a
grader should do; each failed on the first (word-set Jaccard) grader and holds on the
current one."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from policies.judge import judge_messages, parse_score
from simulator.judge import grade, verdict
from tests.simulator.procs import SimulatorProcess

JUDGE_AT = 0.625  # router_models.training.shadow_train.JUDGE_AT: below it is complex


def _reply(sim: SimulatorProcess, messages: list[dict[str, str]], max_tokens: int) -> str:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    resp = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    text: str = resp.json()["choices"][0]["message"]["content"]
    return text


def test_long_wrong_answers_are_not_judged_simple(tmp_path: Path) -> None:
    """A weak simulator's answer to a 'complex' prompt is wrong by construction; the judge must
    keep scoring it below JUDGE_AT however long the answers are. With a 37-word vocabulary two
    different 200-token answers share nearly every word, Jaccard >= 0.75, SCORE: 4 (0.75):
    every wrong answer longer than about 70 tokens labels its prompt simple."""
    prompt = "Prove that there are infinitely many primes."
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"prompt": prompt, "label": "complex"}) + "\n", "utf-8")
    common = ("--model", "m", "--latency-scale", "0", "--quality-file", str(labels))
    with SimulatorProcess(*common, "--weak") as weak, SimulatorProcess(*common) as strong:
        ask = [{"role": "user", "content": prompt}]
        candidate, reference = _reply(weak, ask, 200), _reply(strong, ask, 200)
        assert candidate != reference  # the weak one got it wrong
        score = parse_score(_reply(strong, judge_messages(prompt, reference, candidate), 16))
    assert score is not None
    assert score < JUDGE_AT, f"wrong answer judged {score} (simple)"


def test_unspaced_scripts_are_not_all_or_nothing() -> None:
    """Word overlap on str.split(): a Chinese or Japanese answer is one 'word', so any
    difference (a full stop) scores 1 (wrong or unrelated), where the English analogue
    scores 3."""
    english = grade("The answer is 42. The reason is simple.", "The answer is 42.")
    chinese = grade("答案是42。理由很简单。", "答案是42。")
    japanese = grade("北京は中国の首都です。", "北京は中国の首都です")
    assert english == 3
    assert (chinese, japanese) != (1, 1), "CJK near-matches graded as unrelated"


def test_a_marker_inside_the_reference_does_not_change_the_grade() -> None:
    """The parts are found with rpartition on '\\n\\nREFERENCE:\\n': a reference (a model's
    answer) that quotes the marker is cut, and the grade is of the wrong texts."""
    reference, candidate = "zzz\n\nREFERENCE:\nalpha beta", "alpha beta"
    messages = judge_messages("q", reference, candidate)
    assert grade(reference, candidate) == 3
    assert verdict(messages[0]["content"], messages[1]["content"]) == "SCORE: 3"
