"""Shadow evaluation of tool calls and of answers left empty after thinking.

Every answer is shadowed on the other tier; both tiers are the scripted backend
(``tests.adversarial.bill_upstream``), which answers the shadow's model (``m2``) as the scenario
says: the same tool call, another one, words instead of a call, or nothing after thinking.
The records of the shadow store (``router.shadow.store``) show how far the gateway found the two
answers to agree.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.test_attack_bill import billed_gateway, post
from tests.adversarial.test_attack_shadow_bill import Shadowed

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shadow") / "shadow.jsonl"


@pytest.fixture(scope="module")
def world(store: Path) -> Iterator[Shadowed]:
    """redis-server, the scripted backend behind both tiers, a gateway shadowing every answer
    into ``store``."""
    shadow = {"fast_ratio": 1.0, "precise_ratio": 1.0, "max_waiting": 1000, "store": str(store)}
    with billed_gateway(router={"shadow": shadow}) as stack:
        yield Shadowed(stack.redis, stack.backend, stack.gateway)


def _records(store: Path) -> list[dict[str, Any]]:
    if not store.exists():
        return []
    return [json.loads(line) for line in store.read_text().splitlines() if line.strip()]


def _shadow(world: Shadowed, store: Path, scenario: str, outcome: str, **extra: Any) -> list[Any]:
    """Send a fast-tier request naming ``scenario``; wait for its shadow's ``outcome``; the
    store records it added."""
    _, token = world.key()
    before, counted = len(_records(store)), world.outcomes().get(f"fast_on_precise:{outcome}", 0)
    body = {"model": "fast", "max_tokens": 50, **extra}
    body["messages"] = [{"role": "user", "content": scenario}]
    response = post(world, token, body)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 8
    while world.outcomes().get(f"fast_on_precise:{outcome}", 0) == counted:
        assert time.monotonic() < deadline, f"no shadow {outcome}: {world.outcomes()}"
        time.sleep(0.05)
    return _records(store)[before:]


def test_the_same_tool_call_on_both_tiers_agrees(world: Shadowed, store: Path) -> None:
    """Both tiers call ``get_weather`` with the same arguments (``content: null``): the
    shadow is compared (not ``failed``, not skipped) and they agree fully."""
    [record] = _shadow(world, store, "same_call", "compared")
    assert record["agreement"] == 1.0


def test_a_streamed_tool_call_is_compared_with_the_shadows_whole_one(
    world: Shadowed, store: Path
) -> None:
    """The caller's call came streamed in pieces, the shadow's whole: the same call, so they
    agree fully (the streamed pieces are put together, not dropped for having no
    ``content``)."""
    [record] = _shadow(world, store, "stream_call_same", "compared", stream=True)
    assert record["agreement"] == 1.0


@pytest.mark.parametrize("scenario", ["other_call", "call_or_words"])
def test_a_different_answer_to_a_tool_call_disagrees(
    world: Shadowed, store: Path, scenario: str
) -> None:
    """Another function with other arguments, or words where the caller got a call: compared,
    and far from agreeing."""
    [record] = _shadow(world, store, scenario, "compared")
    assert record["agreement"] < 0.5


@pytest.mark.parametrize("scenario", ["both_empty", "both_thought_only"])
def test_two_empty_answers_after_thinking_do_not_agree(
    world: Shadowed, store: Path, scenario: str
) -> None:
    """Both tiers thought until ``max_tokens`` and answered nothing (``content: ""`` or
    ``null``): there is nothing to compare, so no agreement is recorded (it would be a perfect
    1.0 that says nothing of quality); the outcome is counted ``empty``."""
    assert _shadow(world, store, scenario, "empty") == []


@pytest.mark.parametrize("told", [True, False])
def test_a_judge_that_thinks_first_scores_only_when_told_not_to_think(
    store: Path, told: bool
) -> None:
    """A precise tier serving a reasoning model spends the judge's 16 tokens thinking and
    answers nothing: ``judge:unparsed``, every time (the limit, docs/savings.md). With
    ``router.shadow.judge_fields`` telling it not to think (Qwen3's ``chat_template_kwargs``),
    the judge scores (``SCORE: 4``: 0.75)."""
    fields = {"chat_template_kwargs": {"enable_thinking": False}} if told else {}
    judged = store.with_name(f"judged-{told}.jsonl")
    shadow = {"fast_ratio": 1.0, "max_waiting": 1000, "store": str(judged), "judge_ratio": 1.0}
    with billed_gateway(router={"shadow": {**shadow, "judge_fields": fields}}) as stack:
        world = Shadowed(stack.redis, stack.backend, stack.gateway)
        outcome = "judge:scored" if told else "judge:unparsed"
        _, token = world.key()
        body = {
            "model": "fast",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "whole"}],
        }
        assert post(world, token, body).status_code == 200
        deadline = time.monotonic() + 8
        while world.outcomes().get(outcome, 0) == 0:
            assert time.monotonic() < deadline, f"no {outcome}: {world.outcomes()}"
            time.sleep(0.05)
        deadline = time.monotonic() + 8
        while not _records(judged):
            assert time.monotonic() < deadline, "no shadow record"
            time.sleep(0.05)
    [record] = _records(judged)
    assert record["judge"] == (0.75 if told else None)
