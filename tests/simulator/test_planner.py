"""Request validation and reply planning."""

from __future__ import annotations

import json

import pytest

from simulator.planner import Planner, PlannerConfig
from simulator.schemas import SimError


def _planner(*, echo: bool = False, max_len: int = 64) -> Planner:
    return Planner(PlannerConfig("m", max_len, 2048, 16, 10, echo), seed=0)


def _body(**fields: object) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hello"}], **fields}).encode()


def test_lengths_are_bounded_seeded_and_reasoned() -> None:
    """Reply lengths stay within max_tokens, repeat for a seed, and ``length`` means capped."""
    planner = _planner()
    plans = [planner.plan(_body(max_tokens=6), chat=True) for _ in range(50)]
    assert all(3 <= len(p.output_tokens) <= 6 for p in plans)
    assert all((p.finish_reason == "length") == (len(p.output_tokens) == 6) for p in plans)
    seeded = [planner.plan(_body(max_tokens=6, seed=9), chat=True).pieces for _ in range(3)]
    assert seeded[0] == seeded[1] == seeded[2]
    default = planner.plan(_body(), chat=True)
    assert (len(default.output_tokens), default.finish_reason) == (10, "stop")


def test_context_length_errors_use_vllm_messages() -> None:
    """Too many input tokens, or input plus max_tokens past the limit, is a 400."""
    planner = _planner(max_len=8)
    with pytest.raises(SimError) as long_prompt:
        planner.plan(_body(messages=[{"role": "user", "content": "a b c d e f g"}]), chat=True)
    assert long_prompt.value.status == 400
    assert long_prompt.value.message.startswith(
        "This model's maximum context length is 8 tokens. However, your request has"
    )
    with pytest.raises(SimError) as too_many:
        planner.plan(json.dumps({"prompt": "hi", "max_tokens": 8}).encode(), chat=False)
    assert "maximum context length is 8 tokens" in too_many.value.message


def test_completion_prompt_forms() -> None:
    """A prompt may be a string, a one-string list, or token ids; several prompts are refused."""
    planner = _planner(echo=True)
    assert planner.plan(b'{"prompt": ["a b"], "max_tokens": 5}', chat=False).pieces == ["a", " b"]
    assert len(planner.plan(b'{"prompt": [1, 2, 3]}', chat=False).prompt_tokens) == 3
    with pytest.raises(SimError):
        planner.plan(b'{"prompt": ["a", "b"]}', chat=False)


def test_label_starts_every_reply_without_changing_token_counts() -> None:
    """``--label`` text opens each generated reply; usage counts stay those of the words."""
    plain = Planner(PlannerConfig("m", 64, 2048, 16, 10, False), seed=0)
    labelled = Planner(PlannerConfig("m", 64, 2048, 16, 10, False, label="[simulated]"), seed=0)
    a, b = plain.plan(_body(seed=3), chat=True), labelled.plan(_body(seed=3), chat=True)
    assert "".join(b.pieces).startswith("[simulated] ")
    assert "".join(b.pieces) == "[simulated] " + "".join(a.pieces)
    assert b.output_tokens == a.output_tokens
