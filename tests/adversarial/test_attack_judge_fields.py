"""``router.shadow.judge_fields`` against the judge call's own fields.

The judge asks the precise tier for a score in at most 16 tokens (``policies/judge.py``), and
the shadow accounting counts that call at most 16 completion tokens. ``judge_fields`` adds
fields to its body; some would undo that bound or the answer's shape without a word: vLLM
reads ``max_completion_tokens`` before ``max_tokens`` (the judge generates, and the precise
tier spends, up to it while 16 are counted), ``n`` asks for several answers, ``stream`` for an
event stream the judge cannot read, ``echo`` starts the answer with the judge's last message
(the candidate answer, which may hold ``SCORE: 5``), and the fields the gateway writes itself
(``model``, ``messages``, ``max_tokens``, ``temperature``) were dropped silently. A real
``tiergate serve`` must refuse such a setting at start, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.processes import run_tiergate

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

TIERS = {
    "fast": {"model": "f", "replicas": ["http://127.0.0.1:9"]},
    "precise": {"model": "p", "replicas": ["http://127.0.0.1:9"]},
}


def _config(tmp_path: Path, judge_fields: dict[str, Any]) -> Path:
    shadow = {"judge_ratio": 1.0, "fast_ratio": 1.0, "judge_fields": judge_fields}
    config = {"tiers": TIERS, "auth": {"enabled": False}, "router": {"shadow": shadow}}
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "field",
    [
        {"max_completion_tokens": 4096},
        {"n": 4},
        {"stream": True},
        {"echo": True},
        {"max_tokens": 4096},
        {"model": "other"},
        {"messages": []},
        {"temperature": 1.5},
    ],
    ids=lambda field: next(iter(field)),
)
def test_serve_refuses_a_judge_field_that_overrides_the_judge_call(
    tmp_path: Path, field: dict[str, Any]
) -> None:
    """Start-up fails with a configuration error naming the setting and the field."""
    (name,) = field
    done = run_tiergate("serve", "--config", str(_config(tmp_path, field)), "--port", "9")
    assert done.returncode != 0, done.stderr[-2000:]
    assert "judge_fields" in done.stderr, done.stderr[-2000:]
    assert name in done.stderr.split("judge_fields", 1)[1], done.stderr[-2000:]


def test_thinking_switch_in_judge_fields_is_accepted(tmp_path: Path) -> None:
    """The documented use (Qwen3 told not to think) loads: the configuration check passes."""
    fields = {"chat_template_kwargs": {"enable_thinking": False}}
    done = run_tiergate("check-exposure", "--config", str(_config(tmp_path, fields)))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_refused_judge_field_is_named_and_no_value_is_echoed(tmp_path: Path) -> None:
    """``judge_fields`` may carry a credential for the precise tier's server (a header-like
    field): the start-up error names the refused field, never quotes a value of the mapping."""
    secret = "sk-judge-secret-0123456789"
    fields = {"n": 4, "vllm_xargs": {"api_key": secret}}
    done = run_tiergate("serve", "--config", str(_config(tmp_path, fields)), "--port", "9")
    assert done.returncode != 0, done.stderr[-2000:]
    assert "judge_fields" in done.stderr, done.stderr[-2000:]
    assert "may not set n" in done.stderr, done.stderr[-2000:]
    assert secret not in done.stderr, done.stderr[-2000:]
    assert "sk-judge" not in done.stderr, done.stderr[-2000:]
