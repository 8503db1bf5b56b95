"""Attacks from the official ``openai`` client's side: does "one endpoint that just works" hold?

The client retries 408, 409, 429 and every 5xx (twice by default), waits what ``retry-after-ms``
or ``Retry-After`` says (up to two minutes; longer: no retry), and obeys ``x-should-retry``.
Each test counts the requests the client sent (an httpx event hook) and checks that the
gateway received exactly those (its access log, by the request id the test sets), so a
refusal retried in vain shows as three requests for one call. One redis-server (keys, limits
and budgets), a zero-latency fast simulator, a slow precise one and one ``tiergate serve``
serve the whole module.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Unpack

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_budgets_usage import new_key
from tests.key_fields import KeyPolicyFields
from tests.stack import FAST_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

# The precise tier streams slowly (20 tokens a second), so a stream there holds its slot.
SLOW_PRECISE = (
    "--profile",
    "precise",
    "--model",
    "tiergate-precise",
    "--decode-tokens-per-s",
    "20",
)
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _configure(config: dict[str, Any], backends: Backends) -> None:
    asyncio.run(new_key(backends.redis_url))  # the gateway refuses to start with no key
    del config["telemetry"]  # the access log on: the gateway's own count of requests
    config["auth"] = {"store": "redis"}
    config["ratelimit"] = {"backend": "redis"}
    config["redis"] = {"url": backends.redis_url}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Redis, a fast and a slow simulator, one gateway with keys and limits on Redis."""
    with running_stack(sims=[FAST_SIM, SLOW_PRECISE], redis=True, configure=_configure) as up:
        yield up


@dataclass
class Caller:
    """An ``openai.OpenAI`` client with the default retries whose requests are recorded."""

    gateway: GatewayProcess
    client: openai.OpenAI
    request_id: str = field(default_factory=lambda: "atk-client-" + uuid.uuid4().hex)
    sent: list[float] = field(default_factory=list)  # when each request left (monotonic)

    @property
    def headers(self) -> dict[str, str]:
        """``extra_headers`` that tag every try of one call with this caller's request id."""
        return {"x-request-id": self.request_id}

    def received(self) -> int:
        """How many of this caller's requests the gateway logged: waits until it logged as
        many as were sent (each was answered before the call returned), then counts."""
        deadline = time.monotonic() + 5.0
        while True:
            seen = [
                e for e in self.gateway.access_lines() if e.get("request_id") == self.request_id
            ]
            if len(seen) >= len(self.sent) or time.monotonic() > deadline:
                return len(seen)
            time.sleep(0.02)


def caller(stack: Stack, token: str, **options: Any) -> Caller:
    """A recorded client for ``token`` (``options``: the client's, e.g. ``timeout``)."""
    sent: list[float] = []

    def record(_request: httpx2.Request) -> None:
        sent.append(time.monotonic())

    http = openai.DefaultHttpxClient(event_hooks={"request": [record]})
    client = openai.OpenAI(
        api_key=token, base_url=stack.gateway.url + "/v1", http_client=http, **options
    )
    return Caller(stack.gateway, client, sent=sent)


def key(stack: Stack, **policy: Unpack[KeyPolicyFields]) -> str:
    """A new key in the stack's Redis store; its token."""
    return asyncio.run(new_key(stack.redis_url, **policy))[1]


def test_a_request_larger_than_the_keys_tpm_is_sent_once(stack: Stack) -> None:
    """A request that reserves more tokens than the key's whole tpm can never be admitted:
    the client is told not to retry it (one request, not three, and no backoff wait)."""
    me = caller(stack, key(stack, tpm=100))
    with pytest.raises(openai.RateLimitError) as refused:
        me.client.chat.completions.create(
            model="fast", messages=HI, max_tokens=300, extra_headers=me.headers
        )
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.request_id == me.request_id
    assert "Lower max_tokens" in refused.value.message
    assert refused.value.response.headers.get("x-should-retry") == "false"
    assert (len(me.sent), me.received()) == (1, 1)


@dataclass(frozen=True)
class Refusal:
    """A refusal no retry can cure: the key's policy, the request, what the client raises."""

    policy: KeyPolicyFields
    body: dict[str, Any]
    error: type[openai.APIStatusError]
    code: str
    param: str | None


REFUSALS = {
    "max_tokens above the key's cap": Refusal(
        {"max_tokens": 16},
        {"max_tokens": 100},
        openai.BadRequestError,
        "max_tokens_exceeded",
        "max_tokens",
    ),
    "tier not allowed": Refusal(
        {"allowed_tiers": frozenset({"fast"})},
        {"model": "precise"},
        openai.PermissionDeniedError,
        "tier_not_allowed",
        "model",
    ),
    "unknown model": Refusal(
        {}, {"model": "gpt-4o"}, openai.NotFoundError, "model_not_found", "model"
    ),
    "more completions than max_n": Refusal({}, {"n": 3}, openai.BadRequestError, "n_exceeded", "n"),
    "context too long": Refusal(
        {},
        {"messages": [{"role": "user", "content": "word " * 40_000}]},
        openai.BadRequestError,
        "context_length_exceeded",
        "messages",
    ),
    "body too large": Refusal(
        {},
        {"messages": [{"role": "user", "content": "x" * 5_000_000}]},
        openai.APIStatusError,
        "request_too_large",
        None,
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_refusals_that_cannot_succeed_are_sent_once(stack: Stack, case: str) -> None:
    """Each refusal that no retry can turn into an answer reaches the client as its error
    class with the gateway's code, param and request id, after one request."""
    refusal = REFUSALS[case]
    me = caller(stack, key(stack, **refusal.policy))
    body: dict[str, Any] = {"model": "fast", "messages": HI, "max_tokens": 8, **refusal.body}
    with pytest.raises(refusal.error) as refused:
        me.client.chat.completions.create(**body, extra_headers=me.headers)
    assert (refused.value.code, refused.value.param) == (refusal.code, refusal.param)
    assert refused.value.request_id == me.request_id
    assert (len(me.sent), me.received()) == (1, 1)


def test_a_concurrency_refusal_is_retried_after_its_retry_after_and_served(stack: Stack) -> None:
    """A key at its concurrency cap gets a 429 the client retries once the gateway's
    ``retry-after-ms`` has passed; the slot freed meanwhile, the retry is served."""
    token = key(stack, max_concurrency=1)
    holder = openai.OpenAI(api_key=token, base_url=stack.gateway.url + "/v1", max_retries=0)
    held = holder.chat.completions.create(model="precise", messages=HI, max_tokens=300, stream=True)
    next(iter(held))  # the stream runs: the key's one slot is taken
    me = caller(stack, token)
    answer: list[Any] = []
    call = threading.Thread(
        target=lambda: answer.append(
            me.client.chat.completions.create(
                model="fast", messages=HI, max_tokens=8, extra_headers=me.headers
            )
        )
    )
    call.start()
    try:
        stack.gateway.access_of(me.request_id)  # the first try was refused (429)...
    finally:
        held.close()  # ...and the slot frees while the client waits
    call.join(timeout=30)
    assert answer
    assert answer[0].choices
    assert me.received() == len(me.sent) == 2
    statuses = [
        e["status"] for e in stack.gateway.access_lines() if e.get("request_id") == me.request_id
    ]
    assert statuses == [429, 200]
    assert me.sent[1] - me.sent[0] >= 0.9  # retry-after-ms: 1000 (with 1 ms of slack)


def test_a_spent_budget_tells_the_client_its_quota_is_spent(stack: Stack) -> None:
    """A key whose daily budget is spent gets OpenAI's ``insufficient_quota`` (not the
    ``rate_limit_exceeded`` a slower pace would cure)."""
    me = caller(stack, key(stack, budget_daily=0.000_001))
    with pytest.raises(openai.RateLimitError) as refused:
        me.client.chat.completions.create(
            model="fast", messages=HI, max_tokens=8, extra_headers=me.headers
        )
    assert (refused.value.code, refused.value.type) == ("insufficient_quota", "insufficient_quota")
    assert refused.value.request_id == me.request_id
    assert refused.value.response.headers["retry-after"]


def test_a_request_dearer_than_the_whole_budget_is_sent_once(stack: Stack) -> None:
    """A request whose reservation costs more than the key's whole daily budget never fits,
    whatever the day: the client is told not to retry it, even in the day's last two minutes
    (when the budget's ``Retry-After`` would be short enough for the client to wait)."""
    me = caller(stack, key(stack, budget_daily=0.000_001))
    with pytest.raises(openai.RateLimitError) as refused:
        me.client.chat.completions.create(
            model="fast", messages=HI, max_tokens=8, extra_headers=me.headers
        )
    assert refused.value.response.headers.get("x-should-retry") == "false"
    assert (len(me.sent), me.received()) == (1, 1)


def test_a_prompt_of_token_id_lists_is_a_prompt(stack: Stack) -> None:
    """``prompt=[[ids...]]`` (the client's ``Iterable[Iterable[int]]``) is served, and two
    such prompts count as two completions against the key's ``max_n``."""
    me = caller(stack, key(stack))
    answer = me.client.completions.create(
        model="fast", prompt=[[9906, 11, 1917]], max_tokens=4, extra_headers=me.headers
    )
    assert answer.choices[0].finish_reason in {"stop", "length"}
    with pytest.raises(openai.BadRequestError) as refused:
        me.client.completions.create(model="fast", prompt=[[1, 2], [3, 4]], max_tokens=4)
    assert (refused.value.code, refused.value.param) == ("n_exceeded", "prompt")


@pytest.mark.parametrize(
    "extra",
    [{"prompt_cache_retention": "24h"}, {"prompt_cache_options": {"ttl": "30m"}}],
    ids=["prompt_cache_retention", "prompt_cache_options"],
)
def test_the_clients_prompt_cache_parameters_are_accepted(
    stack: Stack, extra: dict[str, Any]
) -> None:
    """The client's prompt-cache hints (beside ``prompt_cache_key``, already accepted) are
    OpenAI fields, not unknown ones: the request is served."""
    me = caller(stack, key(stack))
    answer = me.client.chat.completions.create(model="fast", messages=HI, max_tokens=4, **extra)
    assert answer.choices[0].message.content


def test_an_error_mid_stream_raises_the_errors_fields(stack: Stack) -> None:
    """A backend failing after the first token: the client's stream raises ``APIError``
    carrying the error's message (no ``[DONE]`` made it look complete), once, no retry."""
    me = caller(stack, key(stack))
    stack.fast.set_faults(error_mid_stream=1.0)
    try:
        stream = me.client.chat.completions.create(
            model="fast", messages=HI, max_tokens=30, stream=True, extra_headers=me.headers
        )
        with pytest.raises(openai.APIError) as failed:
            for _ in stream:
                pass
    finally:
        stack.fast.set_faults(error_mid_stream=0.0)
    assert not isinstance(failed.value, openai.APIStatusError)
    assert "mid-stream" in failed.value.message
    assert stream.response.headers["x-request-id"] == me.request_id
    assert (len(me.sent), me.received()) == (1, 1)


def test_a_client_timeout_retried_leaves_no_generation_behind(stack: Stack) -> None:
    """The client's ``timeout=`` against a slow backend: it gives up, retries twice (its
    default), and each abandoned try is aborted at the backend, none left generating."""
    before = stack.precise.stats()["aborts_total"]
    me = caller(stack, key(stack), timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        me.client.chat.completions.create(
            model="precise", messages=HI, max_tokens=200, extra_headers=me.headers
        )
    assert (len(me.sent), me.received()) == (3, 3)
    statuses = {
        e["status"] for e in stack.gateway.access_lines() if e.get("request_id") == me.request_id
    }
    assert statuses == {499}
    deadline = time.monotonic() + 5.0
    while stack.precise.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = stack.precise.stats()
    assert (stats["running"], stats["aborts_total"] - before) == (0, 3)
