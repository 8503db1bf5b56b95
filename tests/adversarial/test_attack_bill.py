"""Billing attacks: what the gateway charges and counts against what the backend served.

A real ``tiergate serve`` (keys, token limits and budgets in a real redis-server) sits in front
of a scripted backend process (``tests.adversarial.bill_upstream``) whose every answer reports
a known usage, in the ways other servers report it, or fails to. Each test compares, for one
request on a fresh key, what was served with what the budget (Redis), the usage report
(``/admin/usage``) and the access log charged.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from tests.adversarial.bill_upstream import ANSWER_TOKENS, PROMPT
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.integration.test_budgets_usage import new_key, spent
from tests.processes import free_port, http_answers, terminate, wait_ready
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess
from tests.stack import Backends, running_stack

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

ADMIN = "attack-bill-admin-token-0000000000000"
TIMEOUTS = {"connect_s": 1.0, "first_byte_s": 10.0, "idle_s": 5.0, "total_s": 10.0}
PRECISE_PER_TOKEN = 1 / 1000  # the precise tier's default price


class Bill:
    """The running world: Redis, the scripted backend, the gateway."""

    def __init__(self, redis: RedisServer, backend: str, gateway: GatewayProcess) -> None:
        self.redis, self.backend, self.gateway = redis, backend, gateway

    def key(self, **policy: Any) -> tuple[str, str]:
        """A fresh key (id, token) with a generous daily budget unless told otherwise."""
        return asyncio.run(new_key(self.redis.url, **{"budget_daily": 100.0, **policy}))

    def spent(self, key_id: str) -> float:
        """Today's budget spend of ``key_id`` in Redis."""
        return asyncio.run(spent(self.redis.url, key_id))

    def forwarded(self) -> dict[str, Any]:
        """The body the backend was last sent."""
        answer: dict[str, Any] = httpx.get(self.backend + "/last", timeout=5).json()
        return answer

    def usage(self, key_id: str, within: float = 4.0) -> dict[str, Any] | None:
        """``key_id``'s row of ``/admin/usage?by=key`` once it shows (``None``: never did)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            answer = httpx.get(
                self.gateway.url + "/admin/usage?window=1h&by=key",
                headers={"Authorization": f"Bearer {ADMIN}"},
                timeout=5,
            )
            rows = [row for row in answer.json()["rows"] if row["key_id"] == key_id]
            if rows:
                row: dict[str, Any] = rows[0]
                return row
            time.sleep(0.1)
        return None

    def settled_spend(self, key_id: str, within: float = 4.0) -> float:
        """The spend once it has stopped moving (the settlement runs after the answer)."""
        deadline = time.monotonic() + within
        last = self.spent(key_id)
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = self.spent(key_id)
            if now == last:
                return now
            last = now
        return last

    def client(self, token: str, **options: Any) -> openai.OpenAI:
        """The official client on the gateway, no retries."""
        return openai.OpenAI(
            base_url=self.gateway.url + "/v1", api_key=token, max_retries=0, **options
        )


@contextmanager
def billed_gateway(**extra: Any) -> Iterator[Bill]:
    """redis-server, the scripted backend behind both tiers, one gateway keeping keys, limits,
    budgets and usage in Redis; ``extra`` sections join its configuration."""
    port = free_port()
    command = [sys.executable, "-m", "tests.adversarial.bill_upstream", "--port", str(port)]
    with RedisServer() as redis:
        backend = subprocess.Popen(command, cwd=REPO_ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(backend, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                       what="billing backend", log=lambda: "")  # fmt: skip
            asyncio.run(new_key(redis.url))  # the gateway refuses to start with no key
            tier = {"replicas": [url], "kind": "vllm", "timeouts": TIMEOUTS}
            config = {
                "auth": {"store": "redis", "admin_token": ADMIN},
                "ratelimit": {"backend": "redis"},
                "redis": {"url": redis.url},
                "tiers": {"fast": {"model": "m", **tier}, "precise": {"model": "m2", **tier}},
                **extra,
            }
            with GatewayProcess(config) as gateway:
                gateway.wait_until_ready(timeout=20)
                yield Bill(redis, url, gateway)
        finally:
            terminate(backend)


@pytest.fixture(scope="module")
def bill() -> Iterator[Bill]:
    """The billing stack (:func:`billed_gateway`), shared by the module."""
    with billed_gateway() as stack:
        yield stack


def chat(scenario: str, **extra: Any) -> dict[str, Any]:
    """A precise-tier chat request whose prompt names the backend's scenario."""
    return {
        "model": "precise",
        "messages": [{"role": "user", "content": scenario}],
        "max_tokens": 50,
        **extra,
    }


def post(bill: Bill, token: str, body: dict[str, Any], **options: Any) -> httpx.Response:
    """POST a chat request to the gateway."""
    return httpx.post(
        bill.gateway.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=options.get("timeout", 10),
    )


def test_an_answer_that_reports_its_usage_is_charged_exactly(bill: Bill) -> None:
    """Baseline: 20 + 10 tokens reported, 0.030 charged, the same in /admin/usage. Held."""
    key_id, token = bill.key()
    answer = bill.client(token).chat.completions.create(**chat("whole"))
    assert answer.usage is not None
    assert answer.usage.total_tokens == PROMPT + ANSWER_TOKENS
    assert bill.settled_spend(key_id) == pytest.approx(30 * PRECISE_PER_TOKEN)
    row = bill.usage(key_id)
    assert row is not None
    assert (row["requests"], row["input_tokens"], row["output_tokens"]) == (1, 20, 10)


def test_an_answer_with_null_usage_is_not_free(bill: Bill) -> None:
    """A backend that answers with ``"usage": null`` served 10 tokens: the budget and the
    usage report must count the request, not charge it nothing."""
    key_id, token = bill.key()
    answer = bill.client(token).chat.completions.create(**chat("whole_usage_null"))
    assert answer.choices[0].message.content
    charged = bill.settled_spend(key_id)
    row = bill.usage(key_id)
    assert charged > 0, "a served answer cost nothing against the budget"
    assert row is not None, "a served answer is missing from the report"
    assert row["requests"] == 1


def test_an_answer_without_a_prompt_count_charges_its_prompt(bill: Bill) -> None:
    """Usage with ``total_tokens`` 30 and ``completion_tokens`` 10 but no ``prompt_tokens``:
    the 20 prompt tokens are charged (total minus completion), not 0."""
    key_id, token = bill.key()
    bill.client(token).chat.completions.create(**chat("whole_no_prompt_count"))
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 10)
    assert bill.settled_spend(key_id) == pytest.approx(30 * PRECISE_PER_TOKEN)


def test_a_caller_who_times_out_still_pays_for_the_forwarded_request(bill: Bill) -> None:
    """A non-streaming request forwarded, then the client times out (the openai client's
    ``timeout``): the token limit keeps its reservation (docs/access.md), and the budget must
    not refund it all, or a short client timeout buys unlimited compute for free."""
    key_id, token = bill.key()
    with pytest.raises(openai.APITimeoutError):
        bill.client(token, timeout=1.0).chat.completions.create(**chat("whole_slow"))
    time.sleep(0.5)  # the gateway sees the hang-up and settles
    assert bill.settled_spend(key_id) > 0, "a forwarded request the caller left cost nothing"


def test_a_stream_left_before_its_first_event_pays_its_prompt(bill: Bill) -> None:
    """A stream whose backend has the prompt but sent nothing yet when the client leaves: the
    token limit charges the prompt estimate (docs/access.md); the budget must too."""
    key_id, token = bill.key()
    with pytest.raises(openai.APITimeoutError):
        bill.client(token, timeout=1.0).chat.completions.create(
            **chat("stream_slow_start", stream=True)
        )
    time.sleep(0.5)
    assert bill.settled_spend(key_id) > 0, "a forwarded stream the caller left cost nothing"


def test_usage_on_every_chunk_is_charged_once(bill: Bill) -> None:
    """A backend reporting the running usage on every chunk (then a usage chunk): charged
    20 + 4 once, not the sum of the five reports. Held."""
    key_id, token = bill.key()
    stream = bill.client(token).chat.completions.create(
        **chat("stream_cumulative", stream=True, stream_options={"include_usage": True})
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 4)
    assert bill.settled_spend(key_id) == pytest.approx(24 * PRECISE_PER_TOKEN)


def test_usage_on_the_final_choice_is_charged_and_not_shown_unasked(bill: Bill) -> None:
    """A backend that puts ``usage`` on the final chunk beside ``finish_reason``: charged as
    reported; a caller who did not ask for usage gets none (the gateway asked for it)."""
    key_id, token = bill.key()
    response = post(bill, token, chat("stream_usage_on_final_choice", stream=True))
    assert response.status_code == 200
    assert bill.forwarded()["stream_options"] == {"include_usage": True}
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 3)
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    assert [event for event in events if event.get("usage")] == [], "usage shown unasked"


def test_a_cut_stream_of_two_choices_charges_both(bill: Bill) -> None:
    """``n: 2`` with ``max_tokens: 6``: the backend streams 6 tokens for each choice, then the
    body ends with neither finished and no usage. 12 tokens were streamed to the caller; the
    gateway's own count must charge 12, not clip the sum of both choices to one's 6."""
    key_id, token = bill.key(max_n=2)
    response = post(bill, token, chat("stream_two_choices_cut", stream=True, n=2, max_tokens=6))
    assert response.status_code == 200
    content = [line for line in response.text.splitlines() if '"content"' in line]
    assert len(content) == 12
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 12, (
        f"{len(content)} tokens streamed, {row['output_tokens']} counted"
    )


def test_a_cut_stream_whose_chunks_all_name_the_role_counts_its_tokens(bill: Bill) -> None:
    """A backend that names ``role`` in every chunk's delta (Ollama) streams 6 tokens, then
    the body ends without usage: the gateway's own count charges 6, not 0 (it skipped every
    chunk with a role, taking it for the first, empty one)."""
    key_id, token = bill.key()
    response = post(bill, token, chat("stream_role_on_every_chunk_cut", stream=True))
    assert response.status_code == 200
    assert sum('"content"' in line for line in response.text.splitlines()) == 6
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 6


def test_a_stream_reported_as_no_completion_is_charged_what_it_streamed(bill: Bill) -> None:
    """The backend streams 5 tokens, then reports a completion count that is no number: the
    gateway charges at least the 5 tokens it relayed itself, as it would with no usage at all
    (clipping guards against a backend claiming too much; this, too little)."""
    key_id, token = bill.key()
    response = post(bill, token, chat("stream_claims_no_completion", stream=True))
    assert response.status_code == 200
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 5)


def test_chunks_over_several_data_lines_are_charged_like_single_lines(bill: Bill) -> None:
    """Chunks whose data comes over two ``data`` lines (the first empty; an SSE client joins
    them): a cut stream's 5 tokens are charged 5, and a usage chunk so split is the
    backend's usage (20 + 7), not the gateway's count of 2."""
    key_id, token = bill.key()
    response = post(bill, token, chat("stream_split_lines_cut", stream=True))
    assert response.status_code == 200
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 5
    key_id, token = bill.key()
    response = post(bill, token, chat("stream_split_usage", stream=True))
    assert response.text.endswith("data: [DONE]\n\n")
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 7)


def test_a_whole_answer_reported_as_no_completion_is_not_free(bill: Bill) -> None:
    """A whole answer of 10 tokens ("word " ten times, 50 characters) reported as
    ``"completion_tokens": 0``: its text is counted roughly, as the prompt is (four characters
    a token: 13), within what it reserved (50), where it was charged no completion at all."""
    key_id, token = bill.key()
    answer = bill.client(token).chat.completions.create(**chat("whole_claims_no_completion"))
    assert answer.choices[0].message.content
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 13)
    assert bill.settled_spend(key_id) == pytest.approx(33 * PRECISE_PER_TOKEN)


async def _token_debt(url: str, key_id: str, tpm: int) -> float:
    """The key's token debt now (tokens charged in the last minute, drained at ``tpm``)."""
    client = Redis.from_url(url)
    try:
        [bucket] = [k async for k in client.scan_iter(f"*rl:{{{key_id}}}")]
        debt, stamp = await client.hmget(bucket, ["t", "s"])
        seconds, micros = await client.time()
    finally:
        await client.aclose()
    assert debt is not None
    assert stamp is not None
    elapsed_s = seconds + micros / 1e6 - int(stamp) / 1e6
    return max(0.0, float(debt) - elapsed_s * tpm / 60)


@pytest.mark.parametrize("scenario", ["whole", "whole_usage_null", "whole_slow"])
def test_the_token_limit_and_the_budget_charge_the_same_tokens(bill: Bill, scenario: str) -> None:
    """An answer with usage, one without, one the client timed out on: the key's token debt
    and its budget spend (at 1 per 1,000 tokens) name the same number of tokens. Held after the
    fixes above (before them the budget charged 0 for the last two)."""
    tpm = 60  # drains 1 token a second; the reservation (58) fits
    key_id, token = bill.key(tpm=tpm)
    try:
        bill.client(token, timeout=1.0).chat.completions.create(**chat(scenario))
    except openai.APITimeoutError:
        assert scenario == "whole_slow"
    charged = bill.settled_spend(key_id) / PRECISE_PER_TOKEN
    debt = asyncio.run(_token_debt(bill.redis.url, key_id, tpm))
    assert charged > 0
    assert debt == pytest.approx(charged, abs=4)  # what drained since the admission


def _generated(sims: Iterable[SimulatorProcess]) -> int:
    """Completion tokens the simulators generated, by their own ``/metrics``."""
    total = 0.0
    for sim in sims:
        for line in httpx.get(sim.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _shadow_everything(config: dict[str, Any], _backends: Backends) -> None:
    config["auth"]["admin_token"] = ADMIN
    config["router"] = {"shadow": {"fast_ratio": 1.0, "precise_ratio": 1.0, "max_waiting": 1000}}


def test_the_usage_report_accounts_for_the_tokens_shadows_generate() -> None:
    """Shadowing every request: the backends generate each answer twice (the caller's and the
    shadow's on the other tier); the usage report, the operator's record of what the tiers
    spent, should account for both."""
    with running_stack(configure=_shadow_everything) as stack:
        for _ in range(3):
            body = {"model": "fast", "max_tokens": 8, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "Say hello."}]}  # fmt: skip
            assert stack.post(body).status_code == 200
        deadline = time.monotonic() + 5
        while stack.precise.stats()["requests_total"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the shadows run after the answers
        generated = _generated(stack.sims)
        assert generated == 48, "3 answers and 3 shadows of 8 tokens"
        report = httpx.get(
            stack.gateway.url + "/admin/usage?window=1h&by=tier",
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=5,
        )
        assert report.status_code == 200, report.text
    assert report.json()["total"]["output_tokens"] == generated
