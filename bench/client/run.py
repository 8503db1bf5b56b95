"""Upstream HTTP-client benchmark: which async client should the gateway use to reach vLLM?

POSTs a small chat completion to the fixed-response upstream (bench/harness/fixed_upstream.py)
with (a) httpx.AsyncClient and its default httpcore transport, (b) httpx.AsyncClient over
httpx_aiohttp.AiohttpTransport, (c) aiohttp.ClientSession with a tuned TCPConnector and (d)
the gateway's own request-path client (gateway/upstream/pool.py), at concurrency 1, 16 and
64. Every client gets the same pool size, reads the whole body and runs on uvloop; the client
is pinned to CPU 0 and the upstream to CPU 1, both at high priority (as root) so other work
on a shared machine moves the numbers less.

Usage: ``.venv/bin/python bench/client/run.py [--requests 3000] [--repeat 3] [--out FILE]
[--clients aiohttp.clientsession,tiergate]`` (``--clients``: only the clients whose name
contains one of the words).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import httpx_aiohttp
import uvloop

from bench.harness.legs import REPO_ROOT, Placement, start_fixed_upstream
from bench.harness.markdown import report_head
from bench.harness.processes import boosted_own_session
from gateway.upstream.pool import UpstreamPool

CONCURRENCIES = (1, 16, 64)
POOL_SIZE = 100  # same connection pool size for every client, above the highest concurrency
BODY = json.dumps(
    {
        "model": "tiergate-fast",
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 16,
    }
).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-upstream"}


@dataclass
class Client:
    """One client under test: a coroutine that POSTs once and returns the status, and a close."""

    post: Callable[[], Awaitable[int]]
    close: Callable[[], Awaitable[None]]


def _httpx_client(url: str, transport: httpx.AsyncBaseTransport | None) -> Client:
    limits = httpx.Limits(max_connections=POOL_SIZE, max_keepalive_connections=POOL_SIZE)
    client = (
        httpx.AsyncClient(transport=transport, timeout=30)
        if transport is not None
        else httpx.AsyncClient(limits=limits, timeout=30)
    )

    async def post() -> int:
        response = await client.post(url, content=BODY, headers=HEADERS)
        await response.aread()
        return response.status_code

    return Client(post, client.aclose)


def make_httpx(url: str) -> Client:
    """httpx.AsyncClient with its default (httpcore) transport."""
    return _httpx_client(url, None)


def make_httpx_aiohttp(url: str) -> Client:
    """httpx.AsyncClient over httpx_aiohttp.AiohttpTransport."""
    limits = httpx.Limits(max_connections=POOL_SIZE, max_keepalive_connections=POOL_SIZE)
    return _httpx_client(url, httpx_aiohttp.AiohttpTransport(limits=limits))


def make_aiohttp(url: str) -> Client:
    """aiohttp.ClientSession with a keep-alive TCPConnector sized like the others."""
    connector = aiohttp.TCPConnector(
        limit=POOL_SIZE, limit_per_host=POOL_SIZE, keepalive_timeout=30, ttl_dns_cache=300
    )
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=30),
        skip_auto_headers=("User-Agent",),
    )

    async def post() -> int:
        async with session.post(url, data=BODY, headers=HEADERS) as response:
            await response.read()
            return response.status

    return Client(post, session.close)


def make_tiergate(url: str) -> Client:
    """TierGate's own request-path client (gateway/upstream/pool.py), pool size like the others."""
    pool = UpstreamPool(limit_per_host=POOL_SIZE, keepalive_s=30.0)

    async def post() -> int:
        response = await pool.post(url, BODY, HEADERS)
        await response.read()
        response.release()
        return response.status

    return Client(post, pool.close)


CLIENTS: dict[str, Callable[[str], Client]] = {
    "`httpx.AsyncClient` (default httpcore transport)": make_httpx,
    "`httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport(...))`": make_httpx_aiohttp,
    "`aiohttp.ClientSession` (tuned `TCPConnector`)": make_aiohttp,
    "TierGate `UpstreamPool` (asyncio protocol + httptools)": make_tiergate,
}


@dataclass(frozen=True)
class Point:
    """One run: throughput, latency percentiles, non-200 answers."""

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


async def _burst(client: Client, total: int, concurrency: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    left = total
    errors = 0

    async def worker() -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            start = time.perf_counter()
            if await client.post() != 200:
                errors += 1
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began, latencies, errors


async def run_point(make: Callable[[str], Client], url: str, total: int, c: int) -> Point:
    """Fresh client, a short warm-up, then ``total`` POSTs at concurrency ``c``."""
    client = make(url)
    try:
        await _burst(client, min(300, total), c)
        elapsed, latencies, errors = await _burst(client, total, c)
    finally:
        await client.close()
    cuts = statistics.quantiles(latencies, n=100)
    return Point(total / elapsed, cuts[49] * 1000, cuts[98] * 1000, errors)


def median_point(points: list[Point]) -> tuple[Point, float, float]:
    """The run with the median req/s, plus the lowest and highest req/s seen."""
    ordered = sorted(points, key=lambda p: p.rps)
    return ordered[len(ordered) // 2], ordered[0].rps, ordered[-1].rps


async def measure_all(
    url: str, total: int, repeat: int, clients: dict[str, Callable[[str], Client]]
) -> dict[str, dict[int, list[Point]]]:
    """Every client at every concurrency, ``repeat`` times each, interleaved to spread noise."""
    results: dict[str, dict[int, list[Point]]] = {name: {} for name in clients}
    for round_no in range(repeat):
        for c in CONCURRENCIES:
            for name, make in clients.items():
                point = await run_point(make, url, total, c)
                results[name].setdefault(c, []).append(point)
                print(
                    f"  round {round_no + 1} C={c:<3} {point.rps:>8,.0f} req/s "
                    f"p50 {point.p50_ms:6.2f} ms p99 {point.p99_ms:6.2f} ms  {name}",
                    flush=True,
                )
    return results


def render(results: dict[str, dict[int, list[Point]]], total: int, repeat: int, cmd: str) -> str:
    """Markdown: one row per client, median req/s (range) and median-run p50/p99 per C."""
    head = " | ".join(f"C={c} req/s (p50 / p99 ms)" for c in CONCURRENCIES)
    lines = [
        *report_head("Upstream HTTP-client benchmark", cmd),
        f"- {total:,} POSTs per point after a 300-request warm-up, fresh client per point, "
        f"{repeat} interleaved rounds: median req/s with the range in brackets",
        f"- fixed-response upstream (raw uvloop + httptools) pinned to CPU 1, client on CPU 0; "
        f"uvloop; pool size {POOL_SIZE} for every client; the body is read, not parsed",
        f"- httpx {httpx.__version__}, aiohttp {aiohttp.__version__}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "",
        f"| client | {head} |",
        "|---|" + "---:|" * len(CONCURRENCIES),
    ]
    for name, by_c in results.items():
        cells = []
        for c in CONCURRENCIES:
            mid, low, high = median_point(by_c[c])
            errors = sum(p.errors for p in by_c[c])
            cells.append(
                f"{mid.rps:,.0f} [{low:,.0f}-{high:,.0f}] ({mid.p50_ms:.2f} / {mid.p99_ms:.2f})"
                + (f" **{errors} errors**" if errors else "")
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Start the upstream, measure every client, write the Markdown report."""
    parser = argparse.ArgumentParser(description="upstream HTTP-client benchmark")
    parser.add_argument("--requests", type=int, default=3000, help="POSTs per point")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "client.md")
    parser.add_argument(
        "--clients", default="", help="comma-separated words; only clients whose name has one"
    )
    args = parser.parse_args(argv)
    words = [w.strip().lower() for w in args.clients.split(",") if w.strip()]
    clients = {
        name: make
        for name, make in CLIENTS.items()
        if not words or any(w in name.lower() for w in words)
    }
    pin = Placement.build(pin=True, boost=True)
    if "taskset" in pin.proxy:
        os.sched_setaffinity(0, {0})
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-client-bench-"))
    upstream = start_fixed_upstream(workdir, pin)
    try:
        with boosted_own_session():
            results = uvloop.run(
                measure_all(upstream.chat_url, args.requests, args.repeat, clients)
            )
    finally:
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    cmd = " ".join([".venv/bin/python", "bench/client/run.py", *(argv or sys.argv[1:])])
    text = render(results, args.requests, args.repeat, cmd)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
