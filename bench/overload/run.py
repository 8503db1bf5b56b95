"""``make bench-overload``: a batch tenant floods, interactive tenants keep asking, then half
the fast tier goes away. Per leg (FIFO, fair queuing, fair queuing + headroom for interactive,
fair queuing + spill) and per tenant:
TTFT p50/p99 of streamed answers, goodput within the SLO, 429/503 counts, spill rate.

Usage: ``.venv/bin/python bench/overload/run.py [--legs fifo,fair,fair+headroom,fair+spill]
[--phase-s 12] [--workers 1] [--out bench/results/overload.md]``

Each leg starts its own simulators (fast tier: two replicas of ``SLOTS`` sequences, precise
tier: one) and one gateway (``--workers``, each with ``max_concurrency`` = the simulators'
slots divided by the workers), then runs three phases of ``--phase-s`` seconds: *calm*
(light tenants only), *flood* (plus the heavy tenant) and *brown-out* (the flood goes on, one
fast replica is killed).

- light tenants ``light-1..3``: interactive keys, each an open loop of ``LIGHT_RPS`` streamed
  requests a second (a request that finds no answer is counted, never retried);
- the heavy tenant: a batch key, ``HEAVY_WORKERS`` requests always in flight (ten times the
  fast tier's slots shared by four tenants), each worker waiting the ``Retry-After`` of a 503;
- SLO: a 200 whose first token came within ``SLO_TTFT_S``; goodput = such answers a second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402  # after the path fix
import yaml  # noqa: E402  # same

from bench.harness.processes import Service, free_port, http_answers  # noqa: E402  # same
from gateway.access.keystore_file import FileKeyStore  # noqa: E402  # same
from policies.keys import issue_key  # noqa: E402  # same
from policies.principal import KeyPolicy  # noqa: E402  # same

SLOTS = 4  # sequences per simulated replica, and the gateway's max_concurrency
LIGHT = ("light-1", "light-2", "light-3")
LIGHT_RPS = 2.0
HEAVY_WORKERS = 10 * 2 * SLOTS // 4  # ten times its share of the fast tier's slots
SLO_TTFT_S = 1.0
HEADROOM_SHARE = 0.5  # queue.batch_max_share of the ``+headroom`` legs
MAX_TOKENS = 32
PHASES = ("calm", "flood", "brown-out")
BODY = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "max_tokens": MAX_TOKENS,
    "stream": True,
}


@dataclass
class Outcome:
    """One request: who, in which phase, status, TTFT, and the tier that answered."""

    tenant: str
    phase: str
    status: int
    ttft_s: float | None = None
    retry_after: bool = False
    spilled: bool = False


@dataclass
class Leg:
    """One leg's settings and what it measured."""

    name: str
    policy: str
    spill: bool
    batch_max_share: float = 1.0
    outcomes: list[Outcome] = field(default_factory=list)
    phase_s: float = 0.0
    workers: int = 1  # gateway workers, each with SLOTS // workers slots per replica


def _sim(name: str, profile: str, workdir: Path) -> Service:
    port = free_port()
    cmd = [sys.executable, "-m", "simulator", "--port", str(port), "--profile", profile]
    cmd += ["--max-num-seqs", str(SLOTS), "--latency-scale", "2", "--replica-name", name]
    service = Service(name, cmd, port, workdir / f"{name}.log")
    service.start(http_answers(f"http://127.0.0.1:{port}/health"))
    return service


def _keys(workdir: Path) -> dict[str, str]:
    store = FileKeyStore(workdir / "keys.yaml")
    tokens = {}
    for tenant in (*LIGHT, "heavy"):
        policy = KeyPolicy(priority="batch" if tenant == "heavy" else "interactive")
        record, tokens[tenant] = issue_key(tenant, policy, now=time.time())
        store.put_sync(record)
    return tokens


def _gateway(leg: Leg, fast: list[Service], precise: Service, workdir: Path) -> Service:
    def tier(model: str, sims: list[Service]) -> dict[str, Any]:
        urls = [f"http://127.0.0.1:{s.port}" for s in sims]
        return {"model": model, "replicas": urls, "max_concurrency": SLOTS // leg.workers}

    config: dict[str, Any] = {
        "auth": {"keys_file": str(workdir / "keys.yaml")},
        "telemetry": {"access_log": False, "log_level": "warning"},
        "health": {"interval_s": 0.5},
        "queue": {
            "policy": leg.policy,
            "max_length": 64,
            "batch_wait_s": 5.0,
            "batch_max_share": leg.batch_max_share,
        },
        "tiers": {
            "fast": {**tier("tiergate-fast", fast), "max_queue_wait_s": 2.0},
            "precise": {**tier("tiergate-precise", [precise]), "max_queue_wait_s": 2.0},
        },
    }
    if leg.spill:
        config["spillover"] = {"enabled": True}
    if leg.workers > 1:  # no limits on the keys: each worker may count on its own
        config["ratelimit"] = {"memory_divide_per_worker": True}
    path = workdir / f"{leg.name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)]
    cmd += ["--workers", str(leg.workers)]
    service = Service(f"gateway-{leg.name}", cmd, port, workdir / f"gateway-{leg.name}.log")
    service.start(http_answers(f"http://127.0.0.1:{port}/livez"))
    return service


async def _one(client: httpx.AsyncClient, url: str, token: str, tenant: str, phase: str) -> Outcome:
    headers = {"Authorization": f"Bearer {token}"}
    started = time.monotonic()
    try:
        async with client.stream("POST", url, json=BODY, headers=headers) as response:
            outcome = Outcome(tenant, phase, response.status_code)
            outcome.retry_after = "retry-after" in response.headers
            outcome.spilled = "spill" in response.headers.get("x-tiergate-route-reason", "")
            async for line in response.aiter_lines():
                if outcome.ttft_s is None and line.startswith("data: {"):
                    outcome.ttft_s = time.monotonic() - started
    except httpx.HTTPError:
        return Outcome(tenant, phase, 0)
    return outcome


class Load:
    """The traffic of one leg: light open loops, the heavy closed loop, the current phase."""

    def __init__(self, url: str, tokens: dict[str, str], leg: Leg) -> None:
        self.url = url + "/v1/chat/completions"
        self.tokens = tokens
        self.leg = leg
        self.phase = PHASES[0]
        self.heavy_on = False
        self.stop = False
        self.pending: set[asyncio.Task[None]] = set()

    async def _record(self, client: httpx.AsyncClient, tenant: str) -> None:
        phase = self.phase
        outcome = await _one(client, self.url, self.tokens[tenant], tenant, phase)
        self.leg.outcomes.append(outcome)

    async def light(self, client: httpx.AsyncClient, tenant: str) -> None:
        """An open loop: a request every 1 / LIGHT_RPS seconds, whatever the answers do."""
        await asyncio.sleep(hash(tenant) % 100 / 100 / LIGHT_RPS)
        while not self.stop:
            task = asyncio.create_task(self._record(client, tenant))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
            await asyncio.sleep(1 / LIGHT_RPS)

    async def heavy(self, client: httpx.AsyncClient) -> None:
        """One of the batch job's workers: ask again at once, or after a 503's Retry-After."""
        while not self.stop:
            if not self.heavy_on:
                await asyncio.sleep(0.05)
                continue
            phase = self.phase
            outcome = await _one(client, self.url, self.tokens["heavy"], "heavy", phase)
            self.leg.outcomes.append(outcome)
            if outcome.status in (429, 503):
                await asyncio.sleep(1.0)


async def _drive(url: str, tokens: dict[str, str], leg: Leg, kill: Service) -> None:
    load = Load(url, tokens, leg)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        loops = [asyncio.create_task(load.light(client, t)) for t in LIGHT]
        loops += [asyncio.create_task(load.heavy(client)) for _ in range(HEAVY_WORKERS)]
        await asyncio.sleep(leg.phase_s)
        load.phase, load.heavy_on = "flood", True
        await asyncio.sleep(leg.phase_s)
        load.phase = "brown-out"
        await asyncio.to_thread(kill.stop)
        await asyncio.sleep(leg.phase_s)
        load.stop = True
        await asyncio.gather(*loops, *list(load.pending))


def run_leg(leg: Leg, workdir: Path) -> None:
    """Start the leg's processes, drive its three phases, stop everything."""
    tokens = _keys(workdir)
    services: list[Service] = []
    try:
        fast = [_sim(f"fast-{i}", "fast", workdir) for i in range(2)]
        services += fast
        precise = _sim("precise-0", "precise", workdir)
        services.append(precise)
        gateway = _gateway(leg, fast, precise, workdir)
        services.append(gateway)
        asyncio.run(_drive(f"http://127.0.0.1:{gateway.port}", tokens, leg, fast[1]))
    finally:
        for service in reversed(services):
            service.stop()


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def _row(leg: Leg, phase: str, tenant: str) -> str:
    mine = [o for o in leg.outcomes if o.phase == phase and o.tenant == tenant]
    ok = [o for o in mine if o.status == 200]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    good = sum(1 for t in ttfts if t <= SLO_TTFT_S)
    refused = [o for o in mine if o.status in (429, 503)]
    other = len(mine) - len(ok) - len(refused)
    without = sum(1 for o in refused if not o.retry_after)
    spilled = sum(1 for o in ok if o.spilled)
    served = sum(1 for o in leg.outcomes if o.phase == phase and o.status == 200)
    return (
        f"| {leg.name} | {phase} | {tenant} | {len(mine)} | {_pct(ttfts, 0.5)} | "
        f"{_pct(ttfts, 0.99)} | {good / leg.phase_s:.1f} | {len(ok) / leg.phase_s:.1f} | "
        f"{len(ok) / served if served else 0:.0%} | "
        f"{sum(o.status == 429 for o in mine)} | {sum(o.status == 503 for o in mine)} | "
        f"{other} | {without} | {spilled / len(ok) if ok else 0:.0%} |"
    )


def report(legs: list[Leg], phase_s: float, workers: int = 1) -> str:
    """The markdown table of every leg, phase and tenant group."""
    lines = [
        "# Overload: a batch flood, interactive tenants, a fast-tier brown-out",
        "",
        f"Command: `bench/overload/run.py --phase-s {phase_s:g} --workers {workers}`, "
        f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on a shared "
        f"{os.cpu_count()}-CPU machine (load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        f"Fast tier: 2 simulated replicas x {SLOTS} slots; precise: 1 x {SLOTS}; {workers} "
        f"gateway worker(s) of {SLOTS // workers} slots per replica each. "
        f"Light: {len(LIGHT)} interactive tenants x {LIGHT_RPS:g} streamed requests/s "
        f"(rows `light` sum them); heavy: a batch key with {HEAVY_WORKERS} requests in flight. "
        f"SLO: 200 and first token within {SLO_TTFT_S:g} s; goodput in answers/s within it; "
        "a request counts in the phase it was sent in. "
        "`other`: any answer but 200/429/503 (a 5xx or a lost connection); `no RA`: 429/503 "
        f"without Retry-After. `+headroom`: `queue.batch_max_share: {HEADROOM_SHARE:g}` "
        "(batch holds at most that share of a tier's slots; other legs: 1, no cap).",
        "",
        "| leg | phase | tenant | requests | TTFT p50 s | TTFT p99 s | goodput/s | 200/s "
        "| share of 200s | 429 | 503 | other | no RA | spilled |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for leg in legs:
        for o in leg.outcomes:
            o.tenant = "light" if o.tenant.startswith("light") else o.tenant
        for phase in PHASES:
            for tenant in ("light", "heavy"):
                if phase != "calm" or tenant == "light":
                    lines.append(_row(leg, phase, tenant))
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the legs asked for and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--legs", default="fifo,fair,fair+headroom,fair+spill")
    parser.add_argument("--phase-s", type=float, default=12.0)
    parser.add_argument(
        "--workers", type=int, default=1, help="gateway workers (slots per replica split)"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/overload.md")
    args = parser.parse_args()
    legs = []
    for name in args.legs.split(","):
        policy = "fifo" if name.startswith("fifo") else "fair"
        leg = Leg(name, policy, spill=name.endswith("+spill"), phase_s=args.phase_s)
        leg.batch_max_share = HEADROOM_SHARE if "+headroom" in name else 1.0
        leg.workers = args.workers
        legs.append(leg)
    for leg in legs:
        with tempfile.TemporaryDirectory(prefix="tiergate-overload-") as tmp:
            run_leg(leg, Path(tmp))
        print(f"leg {leg.name}: {len(leg.outcomes)} requests", flush=True)
    text = report(legs, args.phase_s, args.workers)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
