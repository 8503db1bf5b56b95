"""Prefix-routing benchmark: prefix affinity against round-robin on four simulated replicas.

Usage: ``.venv/bin/python bench/prefix/run.py [--quick] [--out bench/results/prefix.md]``

Four simulator replicas of one tier (realistic prefill cost, a small KV cache so that the
prefix cache matters) sit behind gateways that differ only in their replica strategy. Each
workload runs against round-robin, then prefix affinity through one gateway, then prefix
affinity through two gateway processes that share nothing (requests alternate between them).
Before every run the replicas' counters and unused cached prefixes are reset. The hit rate
comes from the replicas' own ``vllm:prefix_cache_*`` counters; TTFT is measured by the client.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import yaml  # noqa: E402  # after the sys.path fix so that `bench` imports as a package

from bench.overhead.processes import Service, free_port, http_answers  # noqa: E402  # same
from bench.prefix import client, workloads  # noqa: E402  # same
from bench.prefix.report import Row, render  # noqa: E402  # same
from gateway.health import parse_metrics  # noqa: E402  # same

REPLICAS = 4
KV_BLOCKS = 560
SIM_ARGS = (
    "--profile",
    "precise",
    "--model",
    "tiergate-fast",
    "--latency-scale",
    "1.0",
    "--max-num-seqs",
    "32",
    "--time-factor-under-load",
    "2.0",
)


@dataclass(frozen=True)
class Plan:
    """Sizes of the two workloads."""

    groups: int
    per_group: int
    context_words: int
    conversations: int
    turns: int
    user_words: int
    concurrency: int
    chat_concurrency: int
    think_s: float


FULL = Plan(groups=48, per_group=12, context_words=560, conversations=96, turns=16,
            user_words=24, concurrency=16, chat_concurrency=48, think_s=0.3)
QUICK = Plan(groups=48, per_group=4, context_words=560, conversations=48, turns=16,
             user_words=24, concurrency=16, chat_concurrency=48, think_s=0.3)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - local bench URL
        body: bytes = response.read()
        return body


def _post(url: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")  # noqa: S310 - local
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - local
        response.read()


def start_simulators(workdir: Path, kv_blocks: int) -> list[Service]:
    """Four replicas of the fast tier."""
    sims = []
    for index in range(REPLICAS):
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "simulator",
            "--port",
            str(port),
            "--seed",
            str(index),
            "--replica-name",
            f"sim-{index}",
            "--kv-blocks",
            str(kv_blocks),
            *SIM_ARGS,
        ]
        service = Service(f"sim-{index}", cmd, port, workdir / f"sim-{index}.log")
        service.start(http_answers(f"http://127.0.0.1:{port}/health"))
        sims.append(service)
    return sims


def start_gateway(
    name: str, sims: list[Service], strategy: str, workdir: Path, balancing: dict[str, Any]
) -> Service:
    """A gateway whose fast tier is the four replicas with ``strategy``."""
    urls = [f"http://127.0.0.1:{s.port}" for s in sims]
    config = {
        "auth": {"enabled": False},
        "balancing": balancing,
        "telemetry": {"access_log": False, "log_level": "warning"},
        "health": {"interval_s": 1.0},
        "tiers": {
            "fast": {"model": "tiergate-fast", "replicas": urls, "strategy": strategy},
            "precise": {"model": "tiergate-precise", "replicas": urls[:1]},
        },
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "tiergate", "serve", "--config", str(path), "--port", str(port)]
    service = Service(name, cmd, port, workdir / f"{name}.log")
    service.start(http_answers(f"http://127.0.0.1:{port}/livez"))
    return service


def replica_counters(sims: list[Service]) -> list[dict[str, float]]:
    """Per replica: requests received and the prefix-cache counters from its /metrics."""
    out = []
    for sim in sims:
        base = f"http://127.0.0.1:{sim.port}"
        load = parse_metrics(_get(base + "/metrics").decode())
        stats: dict[str, Any] = json.loads(_get(base + "/sim/stats"))
        out.append(
            {
                "requests": float(stats["requests_total"]),
                "queries": load.prefix_queries or 0.0,
                "hits": load.prefix_hits or 0.0,
            }
        )
    return out


def reset(sims: list[Service]) -> None:
    """Zero the replicas' counters and forget their unused cached prefixes."""
    for sim in sims:
        _post(f"http://127.0.0.1:{sim.port}/sim/reset")


def measure(
    label: str, workload: str, sims: list[Service], gateways: list[Service], plan: Plan
) -> Row:
    """One run: reset, play the workload through ``gateways``, read the replicas."""
    reset(sims)
    time.sleep(0.6)  # let the gateways' next scrape see the idle replicas
    urls = [f"http://127.0.0.1:{g.port}" for g in gateways]
    if workload == "grouped":
        data = workloads.grouped(
            groups=plan.groups,
            per_group=plan.per_group,
            context_words=plan.context_words,
            question_words=12,
            max_tokens=16,
            seed=11,
        )
        result = asyncio.run(client.run_independent(urls, data.bodies, plan.concurrency))
    else:
        chats = workloads.chats(
            conversations=plan.conversations, turns=plan.turns, user_words=plan.user_words, seed=12
        )
        result = asyncio.run(
            client.run_chats(
                urls, chats, plan.chat_concurrency, max_tokens=16, think_s=plan.think_s
            )
        )
    return Row.build(workload, label, result, replica_counters(sims))


def run(plan: Plan, workdir: Path, balancing: dict[str, Any], kv_blocks: int) -> list[Row]:
    """Every workload against every strategy, on the same replicas."""
    sims = start_simulators(workdir, kv_blocks)
    gateways: list[Service] = []
    try:
        rr = start_gateway("gw-round-robin", sims, "round_robin", workdir, balancing)
        pa1 = start_gateway("gw-affinity-1", sims, "prefix_affinity", workdir, balancing)
        pa2 = start_gateway("gw-affinity-2", sims, "prefix_affinity", workdir, balancing)
        gateways = [rr, pa1, pa2]
        rows = []
        for workload in ("grouped", "chats"):
            for label, group in (
                ("round_robin", [rr]),
                ("prefix_affinity", [pa1]),
                ("prefix_affinity, 2 gateways", [pa1, pa2]),
            ):
                row = measure(label, workload, sims, group, plan)
                print(row.line(), flush=True)
                rows.append(row)
        return rows
    finally:
        for service in [*gateways, *sims]:
            service.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print and write the report; exit 1 if a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/prefix.md")
    parser.add_argument(
        "--balancing",
        type=json.loads,
        default={},
        help='gateway "balancing" settings as JSON (default: the defaults)',
    )
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=KV_BLOCKS,
        help=f"KV blocks of 16 tokens per replica (default {KV_BLOCKS})",
    )
    parser.add_argument(
        "--turns", type=int, default=None, help="turns per chat in the chat workload (default 16)"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.turns is not None:
        plan = dataclasses.replace(plan, turns=args.turns)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tiergate-prefix-") as tmp:
        rows = run(plan, Path(tmp), args.balancing, args.kv_blocks)
    command = "python bench/prefix/run.py" + (" --quick" if args.quick else "")
    if args.balancing:
        command += f" --balancing '{json.dumps(args.balancing)}'"
    if args.kv_blocks != KV_BLOCKS:
        command += f" --kv-blocks {args.kv_blocks}"
    if args.turns is not None:
        command += f" --turns {args.turns}"
    sim_args = f"--kv-blocks {args.kv_blocks} " + " ".join(SIM_ARGS)
    text, passed = render(
        rows,
        plan=plan.__dict__,
        sim_args=sim_args,
        command=command,
        machine=f"{platform.machine()}, {platform.python_version()}",
        elapsed_s=time.monotonic() - started,
    )
    print(text)
    args.out.write_text(text, encoding="utf-8")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
