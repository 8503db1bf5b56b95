"""Prefix-routing benchmark: prefix affinity against round-robin on four simulated replicas.

Usage: ``.venv/bin/python bench/prefix/run.py [--quick] [--placements N] [--workloads LIST]
[--plan JSON] [--balancing JSON] [--out bench/results/prefix.md]``

Four simulator replicas of one tier (realistic prefill cost, a KV cache sized per workload so
that the prefix cache matters) sit behind gateways that differ only in their replica strategy.
Each workload runs against round-robin, then prefix affinity through one gateway, then prefix
affinity through two gateway processes that share nothing (requests alternate between them).
Before every run the replicas' counters and unused cached prefixes are reset. The hit rate
comes from the replicas' own ``vllm:prefix_cache_*`` counters; TTFT is measured by the client.

Everything is repeated on ``--placements`` sets of fixed replica ports: prefix affinity ranks
replicas by a hash of their URL, so each set is a different (but reproducible) layout of the
prefixes over the replicas, and a target counts as met only when it is met on all of them.
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

from bench.harness.legs import LegUnavailableError, Placement  # noqa: E402  # same
from bench.harness.processes import Service, free_port, http_answers, port_is_free  # noqa: E402  # same
from bench.overhead.peers import ensure_vllm_router, vllm_router_command  # noqa: E402  # same
from bench.prefix import client, workloads  # noqa: E402  # same
from bench.prefix.report import Row, render  # noqa: E402  # same
from gateway.upstream.health import parse_metrics  # noqa: E402  # same

REPLICAS = 4
SERVED_MODEL = "tiergate-fast"
PEER_LABEL = "vllm-router cache_aware"
BASE_PORT = 18401
PLACEMENTS = 3
SIM_ARGS = (
    "--profile",
    "precise",
    "--model",
    SERVED_MODEL,
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
    start_spread_s: float
    grouped_kv_blocks: int
    chats_kv_blocks: int
    turns_spread: float = 0.0


FULL = Plan(
    groups=192,
    per_group=6,
    context_words=560,
    conversations=192,
    turns=16,
    user_words=24,
    concurrency=16,
    chat_concurrency=96,
    think_s=0.6,
    start_spread_s=5.0,
    grouped_kv_blocks=2150,
    chats_kv_blocks=1100,
)
QUICK = dataclasses.replace(FULL, per_group=3, conversations=96)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - local bench URL
        body: bytes = response.read()
        return body


def _post(url: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")  # noqa: S310 - local
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - local
        response.read()


def replica_ports(base_port: int) -> list[int]:
    """Fixed ports when they are free, so that every run of a placement places prefixes alike.

    Prefix affinity ranks replicas by a hash of their URL, as it would rank stable Service
    names in a cluster; random ports would give each run a different placement and balance.
    """
    fixed = [base_port + index for index in range(REPLICAS)]
    if all(port_is_free(port) for port in fixed):
        return fixed
    print(
        f"ports {fixed} are taken; using random ports (placement differs per run)", file=sys.stderr
    )
    return [free_port() for _ in range(REPLICAS)]


def start_simulators(workdir: Path, kv_blocks: int, base_port: int) -> list[Service]:
    """Four replicas of the fast tier."""
    sims = []
    for index, port in enumerate(replica_ports(base_port)):
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
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(path),
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    service = Service(name, cmd, port, workdir / f"{name}.log")
    service.start(http_answers(f"http://127.0.0.1:{port}/livez"))
    return service


def start_vllm_router(sims: list[Service], workdir: Path) -> Service:
    """vllm-router in front of the same replicas, with its ``cache_aware`` policy (defaults)."""
    router = ensure_vllm_router()
    port = free_port()
    workers = [f"http://127.0.0.1:{s.port}" for s in sims]
    no_pin = Placement.build(pin=False, boost=False)
    cmd = vllm_router_command(router.command, port, workers, "cache_aware", no_pin)
    service = Service("vllm-router", cmd, port, workdir / "vllm-router.log")
    try:
        service.start(http_answers(f"http://127.0.0.1:{port}/health"), timeout_s=90)
    except RuntimeError as exc:
        raise LegUnavailableError(f"vllm-router did not start: {exc}") from exc
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
    label: str,
    workload: str,
    sims: list[Service],
    gateways: list[Service],
    plan: Plan,
    *,
    model: str | None = None,
) -> Row:
    """One run: reset, play the workload through ``gateways``, read the replicas.

    ``model`` overrides the requests' model name (the replicas' own name for a router that
    is not TierGate).
    """
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
        result = asyncio.run(
            client.run_independent(urls, data.bodies, plan.concurrency, model=model)
        )
    else:
        chats = workloads.chats(
            conversations=plan.conversations,
            turns=plan.turns,
            user_words=plan.user_words,
            seed=12,
            spread=plan.turns_spread,
        )
        result = asyncio.run(
            client.run_chats(
                urls,
                chats,
                plan.chat_concurrency,
                max_tokens=16,
                think_s=plan.think_s,
                start_spread_s=plan.start_spread_s,
                model=model,
            )
        )
    return Row.build(workload, label, result, replica_counters(sims))


def run_peer(
    workload: str, sims: list[Service], workdir: Path, plan: Plan, unavailable: dict[str, str]
) -> Row | None:
    """The same workload through vllm-router's ``cache_aware`` policy, if it installs."""
    try:
        router = start_vllm_router(sims, workdir)
    except LegUnavailableError as exc:
        unavailable[PEER_LABEL] = str(exc)
        print(f"{PEER_LABEL}: not available: {str(exc).splitlines()[0]}", flush=True)
        return None
    try:
        return measure(PEER_LABEL, workload, sims, [router], plan, model=SERVED_MODEL)
    finally:
        router.stop()


def run_placement(
    plan: Plan,
    workdir: Path,
    balancing: dict[str, Any],
    names: list[str],
    placement: int,
    *,
    unavailable: dict[str, str] | None = None,
) -> list[Row]:
    """Every workload against every strategy, on replicas at ``placement``'s fixed ports.

    Each workload gets fresh replicas with its own KV size (``Plan.*_kv_blocks``): big enough
    for a quarter of the workload's working set plus the imbalance hashing brings, far too
    small for all of it, which is where routing decides whether the prefix cache pays.
    """
    rows = []
    for workload in names:
        kv_blocks = plan.grouped_kv_blocks if workload == "grouped" else plan.chats_kv_blocks
        sims = start_simulators(workdir, kv_blocks, BASE_PORT + 1000 * placement)
        gateways: list[Service] = []
        try:
            rr = start_gateway("gw-round-robin", sims, "round_robin", workdir, balancing)
            pa1 = start_gateway("gw-affinity-1", sims, "prefix_affinity", workdir, balancing)
            pa2 = start_gateway("gw-affinity-2", sims, "prefix_affinity", workdir, balancing)
            gateways = [rr, pa1, pa2]
            for label, group in (
                ("round_robin", [rr]),
                ("prefix_affinity", [pa1]),
                ("prefix_affinity, 2 gateways", [pa1, pa2]),
            ):
                row = dataclasses.replace(
                    measure(label, workload, sims, group, plan), placement=placement
                )
                print(row.line(), flush=True)
                rows.append(row)
            if unavailable is not None and PEER_LABEL not in unavailable:
                peer = run_peer(workload, sims, workdir, plan, unavailable)
                if peer is not None:
                    row = dataclasses.replace(peer, placement=placement)
                    print(row.line(), flush=True)
                    rows.append(row)
        finally:
            for service in [*gateways, *sims]:
                service.stop()
    return rows


DEFAULT_OUT = REPO_ROOT / "bench/results/prefix.md"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--balancing",
        type=json.loads,
        default={},
        help='gateway "balancing" settings as JSON (default: the defaults)',
    )
    parser.add_argument(
        "--placements",
        type=int,
        default=PLACEMENTS,
        help=f"replica placements (port sets) to run, each a different hash layout "
        f"(default {PLACEMENTS})",
    )
    parser.add_argument("--workloads", default="grouped,chats", help="comma-separated")
    parser.add_argument("--plan", type=json.loads, default={}, help="plan overrides (JSON)")
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help=f"skip the peer row ({PEER_LABEL}, installed into bench/.peers on first use)",
    )
    return parser


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, as the report quotes it."""
    command = "python bench/prefix/run.py" + (" --quick" if args.quick else "")
    if args.balancing:
        command += f" --balancing '{json.dumps(args.balancing)}'"
    if args.plan:
        command += f" --plan '{json.dumps(args.plan)}'"
    if args.placements != PLACEMENTS:
        command += f" --placements {args.placements}"
    if args.no_peer:
        command += " --no-peer"
    if args.workloads != "grouped,chats":
        command += f" --workloads {args.workloads}"
    if args.out.resolve() != DEFAULT_OUT:
        out = args.out.resolve()
        command += f" --out {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}"
    return command


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print and write the report; exit 1 if a target is missed."""
    args = _parser().parse_args(argv)
    plan = dataclasses.replace(QUICK if args.quick else FULL, **args.plan)
    names = args.workloads.split(",")
    started = time.monotonic()
    unavailable: dict[str, str] | None = None if args.no_peer else {}
    with tempfile.TemporaryDirectory(prefix="tiergate-prefix-") as tmp:
        rows = [
            row
            for placement in range(args.placements)
            for row in run_placement(
                plan, Path(tmp), args.balancing, names, placement, unavailable=unavailable
            )
        ]
    text, passed = render(
        rows,
        plan=plan.__dict__,
        sim_args="--kv-blocks <per workload> " + " ".join(SIM_ARGS),
        command=_command(args),
        machine=f"{platform.machine()}, {platform.python_version()}",
        elapsed_s=time.monotonic() - started,
        unavailable=unavailable or {},
    )
    print(text)
    args.out.write_text(text, encoding="utf-8")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
