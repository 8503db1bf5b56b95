"""An asyncio load generator that streams every request and times the first token.

TTFT is measured client-side: from sending the request to the first SSE event that carries
content (the gateway relays the engine's first chunk as soon as it has it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.prefix.workloads import Chat, chat_body


@dataclass
class Outcome:
    """One request as the client saw it."""

    ok: bool
    status: int
    ttft_s: float | None
    total_s: float
    text: str = ""
    error: str = ""


@dataclass
class RunResult:
    """Every outcome of one run and its wall time."""

    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def errors(self) -> int:
        """Requests that did not complete cleanly."""
        return sum(not o.ok for o in self.outcomes)


def _content(event: bytes) -> tuple[str, bool]:
    """The delta text of one SSE event and whether it was an error event."""
    if not event.startswith(b"data: ") or event.startswith(b"data: [DONE]"):
        return "", False
    data = json.loads(event[6:])
    if "error" in data:
        return "", True
    pieces = [(c.get("delta") or {}).get("content") or "" for c in data.get("choices", [])]
    return "".join(pieces), False


async def stream_once(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Outcome:
    """POST one streaming request and read it to the end."""
    started = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    done = False
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            detail = (await response.read())[:200].decode("utf-8", "replace")
            return Outcome(
                False, response.status, None, time.perf_counter() - started, error=detail
            )
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                if event.startswith(b"data: [DONE]"):
                    done = True
                    continue
                piece, failed = _content(event)
                if failed:
                    return Outcome(
                        False, 200, ttft, time.perf_counter() - started, error="in-band error"
                    )
                if ttft is None and event.startswith(b"data: "):
                    ttft = time.perf_counter() - started
                parts.append(piece)
    total = time.perf_counter() - started
    return Outcome(done, 200, ttft, total, "".join(parts), "" if done else "no [DONE]")


def _session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency * 2, keepalive_timeout=30)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))


async def run_independent(
    gateways: Sequence[str],
    bodies: Sequence[dict[str, Any]],
    concurrency: int,
    *,
    model: str | None = None,
) -> RunResult:
    """Send ``bodies`` with ``concurrency`` workers, alternating over ``gateways``.

    ``model`` replaces the bodies' model name (a router in front of the replicas directly
    needs the replicas' served name, not the gateway's tier).
    """
    result = RunResult()
    queue: Iterator[tuple[int, dict[str, Any]]] = iter(enumerate(bodies))

    async def worker(session: aiohttp.ClientSession) -> None:
        for index, body in queue:
            url = gateways[index % len(gateways)]
            sent = {**body, "model": model} if model else body
            result.outcomes.append(await stream_once(session, url, sent))

    started = time.perf_counter()
    async with _session(concurrency) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - started
    return result


async def run_chats(
    gateways: Sequence[str],
    chats: Sequence[Chat],
    concurrency: int,
    *,
    max_tokens: int,
    think_s: float = 0.0,
    start_spread_s: float = 0.0,
    model: str | None = None,
) -> RunResult:
    """Play ``chats`` turn by turn, ``concurrency`` chats at a time; turns alternate gateways.

    Between turns a user "thinks" for a random time around ``think_s`` seconds. The users
    arrive spread over the first ``start_spread_s`` seconds rather than all at once. ``model``
    replaces the model name, as in :func:`run_independent`.
    """
    result = RunResult()
    queue = iter(chats)
    turn_counter = itertools.count()
    rng = random.Random(5)

    async def play(session: aiohttp.ClientSession, chat: Chat) -> None:
        history: list[dict[str, str]] = []
        for user in chat.user_turns:
            if history and think_s:
                await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)
            history.append({"role": "user", "content": user})
            url = gateways[next(turn_counter) % len(gateways)]
            body = chat_body(chat, history, max_tokens)
            outcome = await stream_once(session, url, {**body, "model": model} if model else body)
            result.outcomes.append(outcome)
            if not outcome.ok:
                return
            history.append({"role": "assistant", "content": outcome.text})

    async def worker(session: aiohttp.ClientSession, delay: float) -> None:
        await asyncio.sleep(delay)
        for chat in queue:
            await play(session, chat)

    delays = [rng.uniform(0.0, start_spread_s) for _ in range(concurrency)]
    started = time.perf_counter()
    async with _session(concurrency) as session:
        await asyncio.gather(*(worker(session, delay) for delay in delays))
    result.wall_s = time.perf_counter() - started
    return result
