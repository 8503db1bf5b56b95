"""Attacks on where a request goes: the classifier's path, the tier rules, replica choice.

Each test runs real parts: a real ``tiergate serve`` process in front of simulator processes,
the official ``openai`` client where a well-behaved client is measured. A hostile request is
one a client may send without any special scope.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.stack import CHAT_PATH, FAST_SIM, PRECISE_SIM, Stack, running_stack

pytestmark = pytest.mark.slow

# Just under the default long-prompt rule (6,000 estimated tokens, four ASCII characters a
# token), so the classifier, not the rule, decides these requests.
SCORED_CHARS = 23_000
# Room for every hostile prompt here: the backend answers them, so only routing is measured.
LONG_CONTEXT = ("--max-model-len", "131072")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Two zero-latency simulators (fast, precise) behind one gateway, auth off."""
    with running_stack(sims=(FAST_SIM + LONG_CONTEXT, PRECISE_SIM + LONG_CONTEXT)) as running:
        yield running


def _user(text: str) -> dict[str, Any]:
    return {"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}


def _normal_latency(
    stack: Stack, hostile: dict[str, Any], copies: int, answered: frozenset[int] = frozenset({200})
) -> float:
    """Seconds a well-behaved client waits for a short answer while ``copies`` of
    ``hostile`` are being routed by the same gateway process (each answered with a status in
    ``answered``)."""
    statuses: list[int] = []

    def send() -> None:
        reply = httpx.post(stack.gateway.url + CHAT_PATH, json=hostile, timeout=120)
        statuses.append(reply.status_code)

    senders = [threading.Thread(target=send) for _ in range(copies)]
    for sender in senders:
        sender.start()
    time.sleep(0.2)  # the hostile bodies (23 KB) are in and being scored
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="none", max_retries=0)
    started = time.perf_counter()
    client.chat.completions.create(
        model="auto", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    waited = time.perf_counter() - started
    for sender in senders:
        sender.join()
    assert len(statuses) == copies
    assert set(statuses) <= answered, statuses  # hostile, but valid: answered, never a 500
    return waited


def test_latex_openers_without_closers_do_not_stall_other_clients(stack: Stack) -> None:
    """A prompt of 11,000 ``\\[`` openers with no ``\\]`` does not hold the event loop.

    ``router_models.packaging`` looks for LaTeX blocks with a lazy ``\\[.+?\\]``: every
    opener scanned to the end of the text, quadratic in its length (about 2 s for one 23 KB
    prompt on this machine). Three such requests must not keep a short request waiting.
    """
    waited = _normal_latency(stack, _user("\\[" * (SCORED_CHARS // 2)), copies=3)
    assert waited < 1.0, f"a short request waited {waited:.2f}s behind three hostile ones"


def _no_long_prompt_rule(config: dict[str, Any], _: object) -> None:
    config["router"] = {"long_prompt_tokens": None}


def test_megabyte_prompts_without_the_long_prompt_rule_do_not_stall_other_clients() -> None:
    """With ``router.long_prompt_tokens: null`` (documented: "no such rule") every prompt is
    scored; a 1 MB one must not hold the event loop for long.

    The scorer reads only the text's first 4,000 and last 2,000 characters, but the packaging
    pass before it ran its regexes over the whole text: about 1.4 s a megabyte here.
    """
    with running_stack(configure=_no_long_prompt_rule) as stack:
        # The gateway refuses a prompt beyond the replicas' context (400, nothing forwarded:
        # only the gateway's work is measured); routing ran before that.
        waited = _normal_latency(stack, _user("a " * 500_000), 3, frozenset({200, 400}))
    assert waited < 1.0, f"a short request waited {waited:.2f}s behind three 1 MB prompts"


def _route(reply: httpx.Response) -> tuple[str | None, str | None]:
    return reply.headers.get("x-tiergate-tier"), reply.headers.get("x-tiergate-route-reason")


@pytest.mark.xfail(
    strict=True,
    reason="the prompt estimate counts message text only, not the chat template's tokens per "
    "message: 3,000 two-letter turns are estimated at 1,501 tokens, the backend counts 18,000+, "
    "and the long-prompt rule never fires (fixing it moves every reservation and budget "
    "estimate, not a small change)",
)
def test_a_long_chat_of_short_turns_meets_the_long_prompt_rule(stack: Stack) -> None:
    """docs/router.md: prompts over ``router.long_prompt_tokens`` (6,000) go precise by rule.
    A chat of 3,000 short turns is a prompt the backend itself counts far above that."""
    turns = [{"role": ("user", "assistant")[i % 2], "content": "ok"} for i in range(3_001)]
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        max_tokens=4,
        messages=turns,  # type: ignore[arg-type]
    )
    usage = raw.parse().usage
    assert usage is not None
    assert usage.prompt_tokens > 6_000  # the backend's own count
    assert raw.headers.get("x-tiergate-route-reason") == "rule:long_prompt"


@pytest.mark.xfail(
    strict=True,
    reason="rule:json_schema reads response_format only: the same JSON schema sent in vLLM's "
    "own structured-output fields (guided_json, structured_outputs.json), which every key may "
    "send, is scored by the classifier and a trivial prompt goes fast (the tiering docstring "
    "says 'a JSON schema ... go[es] to the precise tier'; docs/router.md names response_format)",
)
def test_a_json_schema_in_vllm_fields_meets_the_structured_output_rule(stack: Stack) -> None:
    """A JSON schema constrains the answer alike in ``response_format`` and in vLLM's own
    ``structured_outputs`` / ``guided_json``: the structured-output rule sends all three
    precise."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    named = {"name": "c", "schema": schema}
    formats: list[dict[str, Any]] = [
        {"response_format": {"type": "json_schema", "json_schema": named}},
        {"structured_outputs": {"json": schema}},
        {"guided_json": schema},
    ]
    routes = [_route(stack.post({**_user("Name a city."), **extra})) for extra in formats]
    assert routes == [("precise", "rule:json_schema")] * 3, routes
