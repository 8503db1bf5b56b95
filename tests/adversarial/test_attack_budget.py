"""Attacks on compute budgets (issue 17): answers that are served but never paid for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_budgets_usage import new_key, spent
from tests.processes import free_port
from tests.redis_server import RedisServer
from tests.stack import Backends, running_stack

pytestmark = pytest.mark.slow
ADMIN = "attack-budget-admin-token-000000000000"
SIM = ("--profile", "precise", "--model", "tiergate-sim", "--latency-scale", "1")
BODY = {
    "model": "precise",
    "max_tokens": 200,
    "ignore_eos": True,
    "stream": True,
    "messages": [{"role": "user", "content": "x" * 396}],
}


def _keys_and_limits_on_redis(config: dict[str, Any], backends: Backends) -> None:
    asyncio.run(new_key(backends.redis_url))  # the gateway refuses to start with no key
    for tier in config["tiers"].values():
        tier["model"] = "tiergate-sim"
    config["auth"] = {"store": "redis", "admin_token": ADMIN}
    config["ratelimit"] = {"backend": "redis"}
    config["redis"] = {"url": backends.redis_url}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[RedisServer, GatewayProcess]]:
    """One redis-server, a simulator that streams at a human pace, one gateway."""
    with running_stack(sims=[SIM], redis=True, configure=_keys_and_limits_on_redis) as stack:
        assert stack.redis is not None
        yield stack.redis, stack.gateway


def read_then_hang_up(gateway: GatewayProcess, token: str, events: int) -> str:
    """Stream a chat answer, keep ``events`` content events, close the connection."""
    text = []
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json=BODY,
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if '"content"' in line:
                text.append(line)
            if len(text) >= events:
                break
    return "".join(text)


def test_a_stream_the_client_hangs_up_on_is_still_charged(
    stack: tuple[RedisServer, GatewayProcess],
) -> None:
    """Tokens streamed to a caller who then disconnects cost something; today they cost 0."""
    redis, gateway = stack
    key_id, token = asyncio.run(new_key(redis.url, budget_daily=100.0))
    received = read_then_hang_up(gateway, token, events=40)
    assert received
    time.sleep(1.0)  # the settlement runs after the stream closed
    # 100 prompt tokens and 40+ completion tokens were served on precise (1 per 1k tokens).
    assert asyncio.run(spent(redis.url, key_id)) >= 0.1


def test_hanging_up_repeatedly_does_not_make_a_spent_budget_unlimited(
    stack: tuple[RedisServer, GatewayProcess],
) -> None:
    """A key whose budget covers two answers cannot read ten by hanging up before the end."""
    redis, gateway = stack
    # Each request reserves (100 + 200) / 1000 = 0.3; the budget covers about two.
    _, token = asyncio.run(new_key(redis.url, budget_daily=0.65))
    served = 0
    for _ in range(10):
        try:
            if read_then_hang_up(gateway, token, events=30):
                served += 1
        except AssertionError:
            break  # a 429: the budget held
        time.sleep(0.3)
    assert served <= 3, f"{served} answers streamed on a budget worth about two"


def remaining_tokens(gateway: GatewayProcess, token: str) -> int:
    """x-ratelimit-remaining-tokens after a one-token probe with the same prompt as BODY."""
    probe = {**BODY, "stream": False, "max_tokens": 1}
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=probe,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text[:300]
    return int(resp.headers["x-ratelimit-remaining-tokens"])


def test_a_non_streaming_request_abandoned_after_forwarding_is_charged(
    stack: tuple[RedisServer, GatewayProcess],
) -> None:
    """Hanging up on a forwarded non-streaming request keeps its reservation; it refunded all."""
    redis, gateway = stack
    tpm = 600  # refills 10 tokens a second: slow enough to compare
    _, fresh = asyncio.run(new_key(redis.url, tpm=tpm))
    untouched = remaining_tokens(gateway, fresh)  # tpm - (100 prompt + 1)
    _, token = asyncio.run(new_key(redis.url, tpm=tpm))
    with pytest.raises(httpx.ReadTimeout):  # the backend is generating 200 tokens
        httpx.post(
            gateway.url + "/v1/chat/completions",
            json={**BODY, "stream": False},
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(10.0, read=0.5),
        )
    time.sleep(0.5)  # the gateway notices the hang-up and settles
    # Reserved and kept: 100 prompt-estimate tokens + max_tokens 200 (+ about 10 refilled).
    assert remaining_tokens(gateway, token) <= untouched - 250


@pytest.mark.parametrize("extra", [{"n": 10}, {"n": 10, "stream": False}])
def test_a_request_for_n_answers_reserves_n_completions(
    stack: tuple[RedisServer, GatewayProcess], extra: dict[str, object]
) -> None:
    """n=10 x 200 tokens can cost 2.1 on a budget of 0.65: refused up front, not forwarded."""
    redis, gateway = stack
    # max_n 10: the key may ask for ten answers; only the budget may refuse them.
    _, token = asyncio.run(new_key(redis.url, budget_daily=0.65, max_n=10))
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={**BODY, **extra},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert resp.status_code == 429, (resp.status_code, resp.text[:300])
    assert "budget" in resp.json()["error"]["message"]


def test_fallback_to_precise_is_priced_when_it_answers() -> None:
    """Fast is down: each request is answered by its precise fallback and charged the precise
    price of the tier that answered, and the key's spend never passes its budget (a fallback
    the budget cannot pay for is not tried: a 503 instead of an answer paid for by nobody)."""
    budget = 0.65

    def fast_down(config: dict[str, Any], backends: Backends) -> None:
        _keys_and_limits_on_redis(config, backends)
        dead = httpx.URL(backends.fast.url).copy_with(port=free_port())
        config["tiers"]["fast"]["replicas"] = [str(dead)]

    with running_stack(sims=[SIM], redis=True, configure=fast_down) as stack:
        redis_url = stack.redis_url
        key_id, token = asyncio.run(new_key(redis_url, budget_daily=budget))
        body = {**BODY, "model": "fast", "stream": False}
        responses = asyncio.run(burst(stack.gateway.url, token, body, 20))
        ok = [r for r in responses if r.status_code == 200]
        assert ok, [r.text[:200] for r in responses[:3]]
        assert all(r.json()["model"] == "tiergate-sim" for r in ok)
        time.sleep(1.0)
        charged = asyncio.run(spent(redis_url, key_id))
    real = sum(r.json()["usage"]["total_tokens"] / 1000 * 1.0 for r in ok)  # precise: 1 per 1k
    assert charged == pytest.approx(real, rel=1e-6)  # re-priced on the tier that answered
    assert charged <= budget + 1e-9, (charged, len(ok))


async def burst(url: str, token: str, body: dict[str, object], n: int) -> list[httpx.Response]:
    """``n`` concurrent chat requests."""
    async with httpx.AsyncClient(timeout=60) as client:
        calls = [
            client.post(
                url + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            )
            for _ in range(n)
        ]
        return list(await asyncio.gather(*calls))


def test_a_stream_the_client_hangs_up_on_appears_in_admin_usage(
    stack: tuple[RedisServer, GatewayProcess],
) -> None:
    """/admin/usage counts the request and the tokens it streamed before the hang-up."""
    redis, gateway = stack
    key_id, token = asyncio.run(new_key(redis.url))
    assert read_then_hang_up(gateway, token, events=20)
    time.sleep(2.0)  # settled after the stream, flushed to Redis once a second
    resp = httpx.get(
        gateway.url + "/admin/usage?window=1h&by=key",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert resp.status_code == 200
    rows = [row for row in resp.json()["rows"] if row["key_id"] == key_id]
    assert rows, "the hung-up stream is missing from /admin/usage"
    assert sum(row["requests"] for row in rows) == 1
    # 20 events were read: the first is the role chunk (no token), so 19 or more tokens.
    assert sum(row["output_tokens"] for row in rows) >= 19


def test_a_stream_the_backend_breaks_mid_way_is_charged_for_what_it_sent() -> None:
    """The backend drops the stream after some tokens: those tokens still cost something."""
    dropping = (*SIM, "--drop-mid-stream", "1.0")
    with running_stack(sims=[dropping], redis=True, configure=_keys_and_limits_on_redis) as stack:
        key_id, token = asyncio.run(new_key(stack.redis_url, budget_daily=100.0))
        resp = stack.post(BODY, key=token, timeout=30)
        content = [line for line in resp.text.splitlines() if '"content"' in line]
        assert content, resp.text[:300]
        assert "[DONE]" not in resp.text
        time.sleep(1.0)
        charged = asyncio.run(spent(stack.redis_url, key_id))
    assert charged > 0, f"{len(content)} content events streamed, 0 charged"
