"""Traffic for the dial tests: external prompts the router never trained on, and a flood.

``mixed(n, seed)`` draws ``n`` conversations from router-dev2's ``use: eval`` rows and
router-dev.jsonl, a quarter complex. ``flood(n)`` is what issue 34's attacker sent: short
trivial requests behind a LaTeX block, plus complex prompts that score high under any defence.
``send`` posts them through a gateway and returns the tier of each; ``send_lean`` does the
same through aiohttp, whose client costs a tenth of httpx's CPU per request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import httpx
import numpy as np

from router_models.records import label_of, read_jsonl
from router_models.training.train import SHARED_DATASETS

LATEX = (
    "$$\\int_0^1 \\frac{x^2}{\\sqrt{1+x^2}}\\,dx = \\sum_{k=0}^{\\infty} \\alpha_k \\theta^k$$\n\n"
)
HIGH = (
    "Write a Python function that parses a CSV file into a list of dicts, handles quoted "
    "fields and embedded newlines, and add pytest unit tests for every edge case.",
    "Prove by induction that the sum of the first n odd numbers is n squared, then derive a "
    "closed form for the sum of the first n cubes and prove it step by step.",
    "Implement a thread-safe LRU cache in Java with O(1) get and put, explain the locking "
    "strategy, and analyse its complexity under contention.",
)


def _messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    messages = record.get("messages")
    if isinstance(messages, list):
        return messages
    return [{"role": "user", "content": record["prompt"]}]


def mixed(n: int, seed: int, complex_share: float = 0.25) -> list[list[dict[str, Any]]]:
    """``n`` external conversations, ``complex_share`` of them complex."""
    records = [r for r in read_jsonl(SHARED_DATASETS / "router-dev2.jsonl") if r["use"] == "eval"]
    records += read_jsonl(SHARED_DATASETS / "router-dev.jsonl")
    complex_ = [r for r in records if label_of(r) == 1]
    simple = [r for r in records if label_of(r) == 0]
    rng = np.random.default_rng(seed)
    out = []
    for is_complex in rng.random(n) < complex_share:
        pool = complex_ if is_complex else simple
        out.append(_messages(pool[int(rng.integers(len(pool)))]))
    return out


def flood(n: int) -> list[list[dict[str, Any]]]:
    """The attacker's ``n`` conversations: "hi" behind LaTeX, and high-scoring complex asks."""
    asks = [LATEX + "hi", *HIGH]
    return [[{"role": "user", "content": asks[i % len(asks)]}] for i in range(n)]


async def send(
    urls: list[str],
    traffic: list[list[dict[str, Any]]],
    key: str | None = None,
    concurrency: int = 16,
) -> list[str]:
    """Every conversation as ``model: auto`` (round-robin over ``urls``); the tier of each."""
    tiers = [""] * len(traffic)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(traffic)):
        queue.put_nowait(i)
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = {"model": "auto", "messages": traffic[i], "max_tokens": 1}
            url = urls[i % len(urls)] + "/v1/chat/completions"
            response = await client.post(url, json=body, headers=headers)
            assert response.status_code == 200, response.text
            tiers[i] = response.headers["x-tiergate-tier"]

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return tiers


async def send_lean(
    urls: list[str],
    traffic: list[list[dict[str, Any]]],
    key: str | None = None,
    concurrency: int = 16,
) -> list[str]:
    """``send`` through aiohttp: the same requests, ``concurrency`` at a time on as many
    keep-alive connections; the tier of each. On the 2-core build machine 2,000 requests cost
    the client 0.5 s of CPU instead of httpx's 4.4 s (the gateway's share: 1.7 s), so the
    client no longer paces the gateway."""
    tiers = [""] * len(traffic)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(traffic)):
        queue.put_nowait(i)
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = {"model": "auto", "messages": traffic[i], "max_tokens": 1}
            url = urls[i % len(urls)] + "/v1/chat/completions"
            async with session.post(url, json=body, headers=headers) as response:
                text = await response.text()
                assert response.status == 200, text
                tiers[i] = response.headers["x-tiergate-tier"]

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return tiers
