"""Slow-replica benchmark: speed-aware replica choice (``balancing.speed_aware``) on and off.

Usage: ``.venv/bin/python bench/slow_replica/run.py [--quick] [--out FILE]``
(default ``bench/results/slow-replica.md``; ``make bench-slow-replica``)

One tier of two simulator replicas, one of them ``--latency-scale 3`` (healthy, answers 200,
three times the time per token: a throttled GPU). Four gateways sit in front of the same two
replicas and differ only in strategy (least_loaded, prefix_affinity) and in
``balancing.speed_aware`` (one gateway process each). Each plays the same workloads,
streamed: *distinct* prompts (each its own prefix key) and *shared-prefix* prompts (a few long
system prompts, short questions), sequentially and 8 at a time. Reported per run: p50/p95
end-to-end latency, p50 time to first token, and the share of requests the slow replica
received (its own ``/sim/stats``).

Then the equal-replica check: both replicas at normal speed, prefix affinity with the feature
on and off, shared-prefix prompts: the replicas' prefix-cache hit rate (their
``vllm:prefix_cache_*`` counters) and the gateway's affinity figure (``/admin/backends``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import yaml  # noqa: E402  # after the sys.path fix so that `bench` imports as a package

from bench.harness.processes import Service, free_port, http_answers  # noqa: E402  # same
from bench.prefix.client import run_independent  # noqa: E402  # same
from bench.slow_replica.mixed import (  # noqa: E402  # same
    MIXED_HEADER,
    mixed_bodies,
    mixed_row,
    play_mixed,
    play_mixed_concurrent,
)
from gateway.upstream.health import parse_metrics  # noqa: E402  # same

ADMIN_TOKEN = "bench-slow-replica-admin-token-000000"  # noqa: S105  # a local bench's own token
SIM_ARGS = ("--profile", "fast", "--model", "tiergate-fast", "--max-num-seqs", "16")
WORDS = ("account", "invoice", "shipment", "refund", "device", "network", "replica", "cache")
MAX_TOKENS = 32


def _get(url: str, token: str | None = None) -> bytes:
    request = urllib.request.Request(url)  # noqa: S310  # a local http URL of ours
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310  # same
        return bytes(answer.read())


def _post(url: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")  # noqa: S310  # same
    with urllib.request.urlopen(request, timeout=10):  # noqa: S310  # same
        pass


def start_sims(scales: tuple[float, ...], workdir: Path) -> list[Service]:
    """One simulator per latency scale."""
    sims = []
    for index, scale in enumerate(scales):
        port = free_port()
        cmd = [sys.executable, "-m", "simulator", "--port", str(port), "--seed", str(index)]
        cmd += [*SIM_ARGS, "--latency-scale", str(scale), "--replica-name", f"sim-{index}"]
        service = Service(f"sim-{index}", cmd, port, workdir / f"sim-{index}-{scale}.log")
        service.start(http_answers(f"http://127.0.0.1:{port}/health"))
        sims.append(service)
    return sims


def start_gateway(name: str, sims: list[Service], strategy: str, aware: bool, workdir: Path) -> str:
    """A gateway whose fast tier is ``sims`` with ``strategy``; its base URL."""
    urls = [f"http://127.0.0.1:{s.port}" for s in sims]
    config = {
        "auth": {"enabled": False, "admin_token": ADMIN_TOKEN},
        "balancing": {"speed_aware": aware},
        "telemetry": {"access_log": False, "log_level": "warning"},
        "tiers": {
            "fast": {"model": "tiergate-fast", "replicas": urls, "strategy": strategy},
            "precise": {"model": "tiergate-precise", "replicas": urls[:1]},
        },
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)]
    cmd += ["--workers", "1"]  # one process: /admin/backends counts every request
    service = Service(name, cmd, port, workdir / f"{name}.log")
    service.start(http_answers(f"http://127.0.0.1:{port}/livez"))
    SERVICES.append(service)
    return f"http://127.0.0.1:{port}"


SERVICES: list[Service] = []


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def bodies(workload: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` streamed chat requests: ``distinct`` (each its own 600-character question) or
    ``shared`` (8 system prompts of ~2,000 characters, each with short questions)."""
    rng = random.Random(seed)
    contexts = [f"Context {i}: " + _words(random.Random(1000 + i), 300) for i in range(8)]
    out = []
    for i in range(n):
        if workload == "distinct":
            messages = [{"role": "user", "content": f"Request {seed}-{i}: {_words(rng, 90)}"}]
        else:
            messages = [
                {"role": "system", "content": rng.choice(contexts)},
                {"role": "user", "content": f"Question {seed}-{i}: {_words(rng, 8)}?"},
            ]
        out.append(
            {"model": "fast", "stream": True, "max_tokens": MAX_TOKENS, "messages": messages}
        )
    return out


def counters(sims: list[Service]) -> list[dict[str, float]]:
    """Per replica: requests received and its prefix-cache counters."""
    out = []
    for sim in sims:
        base = f"http://127.0.0.1:{sim.port}"
        stats = json.loads(_get(base + "/sim/stats"))
        load = parse_metrics(_get(base + "/metrics").decode())
        out.append(
            {
                "requests": float(stats["requests_total"]),
                "queries": load.prefix_queries or 0.0,
                "hits": load.prefix_hits or 0.0,
            }
        )
    return out


def affinity(gateway: str) -> tuple[int, int]:
    """The fast tier's affinity hits and load fallbacks so far."""
    view = json.loads(_get(gateway + "/admin/backends", ADMIN_TOKEN))
    figures = view["tiers"]["fast"]["affinity"]
    return int(figures.get("affinity_hits", 0)), int(figures.get("load_fallbacks", 0))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    gateway: str, sims: list[Service], requests: list[dict[str, Any]], conc: int
) -> dict[str, Any]:
    """Play ``requests`` through ``gateway`` with ``conc`` workers; what the client and the
    replicas saw."""
    for sim in sims:
        _post(f"http://127.0.0.1:{sim.port}/sim/reset")
    hits_before = affinity(gateway)
    result = asyncio.run(run_independent([gateway], requests, conc))
    after = counters(sims)
    hits_after = affinity(gateway)
    total = [o.total_s for o in result.outcomes if o.ok]
    ttft = [o.ttft_s for o in result.outcomes if o.ok and o.ttft_s is not None]
    sent = sum(c["requests"] for c in after)
    queries = sum(c["queries"] for c in after)
    hits, fallbacks = (a - b for a, b in zip(hits_after, hits_before, strict=True))
    return {
        "n": len(result.outcomes),
        "errors": result.errors,
        "p50_s": statistics.median(total),
        "p95_s": _pct(total, 0.95),
        "ttft_p50_s": statistics.median(ttft),
        "slow_share": after[-1]["requests"] / sent if sent else 0.0,
        "hit_rate": sum(c["hits"] for c in after) / queries if queries else 0.0,
        "affinity": hits / (hits + fallbacks) if hits + fallbacks else None,
    }


def _row(label: str, m: dict[str, Any]) -> str:
    aff = "" if m["affinity"] is None else f"{m['affinity']:.1%}"
    return (
        f"| {label} | {m['n']} | {m['errors']} | {m['p50_s'] * 1000:.0f} | "
        f"{m['p95_s'] * 1000:.0f} | {m['ttft_p50_s'] * 1000:.0f} | {m['slow_share']:.1%} | "
        f"{m['hit_rate']:.1%} | {aff} |"
    )


HEADER = (
    "| run | requests | errors | p50 ms | p95 ms | TTFT p50 ms | to replica 2 | "
    "prefix-cache hit rate | affinity |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def play(gateways: dict[str, str], sims: list[Service], sizes: dict[int, int]) -> list[str]:
    """Every workload x concurrency through every gateway, the two speed settings of a
    strategy back to back on the same requests."""
    rows = []
    for workload in ("distinct", "shared"):
        for conc, n in sizes.items():
            requests = bodies(workload, n, seed=conc)
            for label, gateway in gateways.items():
                m = measure(gateway, sims, requests, conc)
                rows.append(_row(f"{workload}, c={conc}, {label}", m))
                print(rows[-1], flush=True)
    return rows


def equal_mixed(workdir: Path, n: int) -> list[str]:
    """Equal replicas, mixed traffic (bench/slow_replica/mixed.py), prefix affinity with the
    feature on and off; the rows."""
    sims = start_sims((1.0, 1.0), workdir)
    try:
        rows = []
        for aware in (True, False):
            gateway = start_gateway(f"gw-mixed-{aware}", sims, "prefix_affinity", aware, workdir)
            for sim in sims:
                _post(f"http://127.0.0.1:{sim.port}/sim/reset")
            setting = f"prefix_affinity, speed {'on' if aware else 'off'}"
            m = play_mixed(gateway, sims, mixed_bodies(n, seed=7), ADMIN_TOKEN)
            rows.append(mixed_row(f"mixed, c=1, {setting}", m))
            print(rows[-1], flush=True)
            for sim in sims:
                _post(f"http://127.0.0.1:{sim.port}/sim/reset")
            m = play_mixed_concurrent(gateway, sims, mixed_bodies(n, seed=8), ADMIN_TOKEN, 4)
            rows.append(mixed_row(f"mixed, c=4, {setting}", m))
            print(rows[-1], flush=True)
        return rows
    finally:
        for service in [*SERVICES, *sims]:
            service.stop()
        SERVICES.clear()


def main() -> None:
    """Run both phases and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--mixed-only", action="store_true", help="only the mixed-traffic leg")
    parser.add_argument("--out", default="bench/results/slow-replica.md")
    args = parser.parse_args()
    mixed_n = 100 if args.quick else 240
    if args.mixed_only:
        with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
            print("\n".join([MIXED_HEADER, *equal_mixed(Path(tmp), mixed_n)]))
        return
    sizes = {1: 40, 8: 80} if args.quick else {1: 120, 8: 320}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
        workdir = Path(tmp)
        try:
            sims = start_sims((1.0, 3.0), workdir)
            gateways = {
                f"{strategy}, speed {'on' if aware else 'off'}": start_gateway(
                    f"gw-{strategy}-{aware}", sims, strategy, aware, workdir
                )
                for strategy in ("least_loaded", "prefix_affinity")
                for aware in (True, False)
            }
            warm = bodies("distinct", 16, seed=99)
            for gateway in gateways.values():  # every gateway has seen both replicas
                asyncio.run(run_independent([gateway], warm, 1))
            slow_rows = play(gateways, sims, sizes)
            for service in [*SERVICES, *sims]:
                service.stop()
            SERVICES.clear()
            sims = start_sims((1.0, 1.0), workdir)
            equal = {
                f"prefix_affinity, speed {'on' if aware else 'off'}": start_gateway(
                    f"gw-equal-{aware}", sims, "prefix_affinity", aware, workdir
                )
                for aware in (True, False)
            }
            equal_rows = []
            for conc, n in sizes.items():
                for label, gateway in equal.items():
                    m = measure(gateway, sims, bodies("shared", n, seed=conc), conc)
                    equal_rows.append(_row(f"shared, c={conc}, {label}", m))
                    print(equal_rows[-1], flush=True)
        finally:
            for service in [*SERVICES, *sims]:
                service.stop()
            SERVICES.clear()
        mixed_rows = equal_mixed(workdir, mixed_n)
    report = [
        "# Slow replica: speed-aware replica choice on and off",
        "",
        f"`.venv/bin/python bench/slow_replica/run.py{' --quick' if args.quick else ''}` on "
        f"{platform.node()} ({platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
        f"{time.time() - started:.0f} s. Streamed chat requests of {MAX_TOKENS} tokens at most; "
        "latency is end to end as the client saw it.",
        "",
        "## One replica 3x slower (`--latency-scale 3`, replica 2)",
        "",
        HEADER,
        *slow_rows,
        "",
        "## Equal replicas (both `--latency-scale 1`): nothing may get worse",
        "",
        HEADER,
        *equal_rows,
        "",
        "## Equal replicas, mixed traffic (bench/slow_replica/mixed.py)",
        "",
        "Long documents (~3,000 tokens) asked 1-4 token questions, half of them streamed, "
        "mixed with streamed chats; one at a time (c=1), then 4 at a time (c=4, where no "
        "request's replica is known). *Repeats on the same replica*: of the requests "
        "whose prefix group came before, the share served where the group's previous one was. "
        "*Speed ratio*: the slower replica's `ms_per_token` over the faster's in "
        "`/admin/backends` after each request (1 while either is unknown); >= 1.5 is where "
        "`speed_aware` starts moving prefixes.",
        "",
        MIXED_HEADER,
        *mixed_rows,
        "",
    ]
    Path(args.out).write_text("\n".join(report), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
