"""Equal replicas, mixed traffic: does the speed signal stay quiet and affinity intact?

Two simulators at the same speed, prefix affinity, ``balancing.speed_aware`` on and off, the
same sequential requests: long documents asked short questions (``max_tokens`` 1-4, half of
them streamed: classification, RAG) mixed with ordinary streamed chats (a few system
prompts, answers of up to 48 tokens). Each request's replica is read from the simulators'
counters, so the leg can tell, per prefix group, whether a repeat landed where the group's
previous request did (*affinity*), and after each request it reads ``/admin/backends``: how
many requests were chosen while one replica's ``ms_per_token`` was ``speed_margin`` (1.5)
times the other's or more (*speed factor >= 1.5*).

Then the same traffic 4 at a time (no per-request replica there): the replicas' prefix-cache
hit rate (their ``vllm:prefix_cache_*`` counters) and the speed ratios.

Usage: ``.venv/bin/python bench/slow_replica/run.py --mixed-only`` (also part of a full run).
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from bench.harness.processes import Service
from gateway.upstream.health import parse_metrics

DOCS = 6  # long documents (~3,000 tokens each), asked 1-4 token questions
CHATS = 6  # chat system prompts (~300 tokens), asked ordinary questions
WORDS = ("claim", "policy", "invoice", "router", "ledger", "tenant", "shard", "quota", "batch")


def _text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def mixed_bodies(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` requests, each with its prefix group: 40 % long documents with ``max_tokens``
    1-4 (half streamed), 60 % streamed chats of up to 48 tokens."""
    rng = random.Random(seed)
    docs = [f"Document {i}: " + _text(2000 + i, 3000) for i in range(DOCS)]
    chats = [f"Assistant {i}: " + _text(3000 + i, 300) for i in range(CHATS)]
    out = []
    for i in range(n):
        if rng.random() < 0.4:
            group = rng.randrange(DOCS)
            system, max_tokens, stream = docs[group], rng.randint(1, 4), rng.random() < 0.5
            name = f"doc-{group}"
        else:
            group = rng.randrange(CHATS)
            system, max_tokens, stream = chats[group], 48, True
            name = f"chat-{group}"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {seed}-{i}: {_text(rng.randrange(10**6), 6)}?"},
        ]
        body = {"model": "fast", "max_tokens": max_tokens, "stream": stream, "messages": messages}
        out.append((name, body))
    return out


def _received(client: httpx.Client, sims: list[Service]) -> list[int]:
    return [
        int(client.get(f"http://127.0.0.1:{s.port}/sim/stats").json()["requests_total"])
        for s in sims
    ]


def _speed_ratio(client: httpx.Client, gateway: str, token: str) -> float:
    """The slowest replica's ms_per_token over the fastest's (1.0 while either is unknown)."""
    view = client.get(gateway + "/admin/backends", headers={"Authorization": f"Bearer {token}"})
    speeds = [r["ms_per_token"] for r in view.json()["tiers"]["fast"]["replicas"]]
    if None in speeds or not speeds:
        return 1.0
    return float(max(speeds) / min(speeds))


def _hit_rate(client: httpx.Client, sims: list[Service]) -> float:
    """The replicas' prefix-cache hits over queries, together."""
    loads = [parse_metrics(client.get(f"http://127.0.0.1:{s.port}/metrics").text) for s in sims]
    queries = sum(load.prefix_queries or 0.0 for load in loads)
    return sum(load.prefix_hits or 0.0 for load in loads) / queries if queries else 0.0


def play_mixed_concurrent(
    gateway: str,
    sims: list[Service],
    requests: list[tuple[str, dict[str, Any]]],
    token: str,
    conc: int,
) -> dict[str, Any]:
    """Send ``requests`` ``conc`` at a time; the hit rate and the speed ratios seen."""
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=conc * 2)) as client:

        def one(body: dict[str, Any]) -> tuple[bool, float]:
            answer = client.post(gateway + "/v1/chat/completions", json=body)
            return answer.status_code != 200, _speed_ratio(client, gateway, token)

        with ThreadPoolExecutor(conc) as pool:
            results = list(pool.map(one, [body for _name, body in requests]))
        ratios = [ratio for _failed, ratio in results]
        return {
            "n": len(requests),
            "errors": sum(failed for failed, _ratio in results),
            "affinity": None,
            "hit_rate": _hit_rate(client, sims),
            "flagged": sum(r >= 1.5 for r in ratios) / len(ratios),
            "max_ratio": max(ratios),
        }


def play_mixed(
    gateway: str, sims: list[Service], requests: list[tuple[str, dict[str, Any]]], token: str
) -> dict[str, Any]:
    """Send ``requests`` one at a time; affinity per prefix group and the speed ratios seen."""
    last: dict[str, int] = {}
    repeats = same = flagged = errors = 0
    ratios = []
    with httpx.Client(timeout=60) as client:
        for name, body in requests:
            before = _received(client, sims)
            with client.stream("POST", gateway + "/v1/chat/completions", json=body) as answer:
                answer.read()
                errors += answer.status_code != 200
            after = _received(client, sims)
            served = [b - a for a, b in zip(before, after, strict=True)]
            replica = served.index(1) if served.count(1) == 1 and sum(served) == 1 else -1
            if name in last:
                repeats += 1
                same += replica == last[name]
            last[name] = replica
            ratio = _speed_ratio(client, gateway, token)
            ratios.append(ratio)
            flagged += ratio >= 1.5
        hit_rate = _hit_rate(client, sims)
    return {
        "n": len(requests),
        "errors": errors,
        "affinity": same / repeats if repeats else 1.0,
        "hit_rate": hit_rate,
        "flagged": flagged / len(requests),
        "max_ratio": max(ratios),
    }


def mixed_row(label: str, m: dict[str, Any]) -> str:
    """One table row."""
    aff = "" if m["affinity"] is None else f"{m['affinity']:.1%}"
    return (
        f"| {label} | {m['n']} | {m['errors']} | {aff} | {m['hit_rate']:.1%} | "
        f"{m['flagged']:.1%} | {m['max_ratio']:.2f} |"
    )


MIXED_HEADER = (
    "| run | requests | errors | repeats on the same replica | prefix-cache hit rate | "
    "speed ratio >= 1.5 after | largest ratio |\n|---|---:|---:|---:|---:|---:|---:|"
)
