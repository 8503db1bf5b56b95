"""Shared pieces of the key adversarial tests: simulators, keys, real `tiergate serve` stacks."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, Unpack

import httpx
from redis.asyncio import Redis

from gateway.access.keys_cli import main as keys_main
from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import KeyRecord, create_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.key_fields import KeyPolicyFields

ADMIN = "adversarial-admin-token-0123456789"
CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def bearer(token: str) -> dict[str, str]:
    """An Authorization header."""
    return {"Authorization": f"Bearer {token}"}


async def redis_key(url: str, **policy: Unpack[KeyPolicyFields]) -> tuple[KeyRecord, str]:
    """A key created straight in the Redis store (as `tiergate keys create --redis-url`)."""
    client = Redis.from_url(url)
    try:
        return await create_key(RedisKeyStore(client), "adv", KeyPolicy(**policy), now=time.time())
    finally:
        await client.aclose()


_G = TypeVar("_G", bound=GatewayProcess)


def start_all(procs: list[_G]) -> list[_G]:
    """Start gateways in parallel (each start waits for /livez), forked ones as forks."""
    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(lambda proc: proc.start(), procs))
    return procs


async def status(http: httpx.AsyncClient, gateway: GatewayProcess, token: str) -> int:
    """The status of an authenticated GET /v1/models."""
    return (await http.get(gateway.url + "/v1/models", headers=bearer(token))).status_code


async def seconds_until(check: Callable[[], Awaitable[bool]], within: float) -> float:
    """Seconds until ``check()`` holds (polled every 10 ms); fails after ``within`` seconds."""
    start = time.monotonic()
    while not await check():
        elapsed = time.monotonic() - start
        assert elapsed < within, f"still not true after {elapsed:.2f}s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def keys_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m gateway keys ...` as an operator would run it."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", "keys", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def keys_cli_here(*argv: str) -> subprocess.CompletedProcess[str]:
    """``keys_cli`` in this process, for a test of what the command does and says rather than
    of an interpreter's start: its entry point, run in a thread (it runs an event loop of its
    own), its output captured."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return keys_main(list(argv))

    code = await asyncio.to_thread(run)
    command = ["tiergate", "keys", *argv]
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())
