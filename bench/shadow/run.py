"""Shadow evaluation and savings on the simulator: what `/admin/routing` and `/admin/usage` say.

    .venv/bin/python bench/shadow/run.py [--requests 600] [--shadow 0.05]

A weak fast simulator (it answers the prompts labelled complex differently) and a strong
precise one share a quality file built at run time from ../shared/datasets/router-dev2.jsonl
(labels only, never copied into the repository). Traffic is drawn from that set's prompts and
sent as ``model: auto`` through a real gateway with shadowing on; the script prints and writes
(bench/results/shadow.md) the two admin views, so the README can quote a real run, and a
summary of the cost and savings with the shadows' own compute counted and without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[2]
DATASET = REPO.parent / "shared" / "datasets" / "router-dev2.jsonl"
ADMIN = "bench-shadow-admin-token-000000000000"


def free_port() -> int:
    """A port nobody listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A background process writing to ``log``."""
    return subprocess.Popen(command, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait(url: str, timeout: float = 60) -> None:
    """Until ``url`` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310  # loopback URL we built
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def admin(url: str) -> dict[str, Any]:
    """GET an admin view."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310  # loopback
        data: dict[str, Any] = json.loads(resp.read())
        return data


async def load(url: str, prompts: list[str], concurrency: int) -> dict[int, int]:
    """Send every prompt as ``model: auto``; count statuses."""
    statuses: dict[int, int] = {}
    queue = list(prompts)

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            prompt = queue.pop()
            body = {
                "model": "auto",
                "max_tokens": 24,
                "messages": [{"role": "user", "content": prompt}],
            }
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return statuses


def summary(usage: dict[str, Any]) -> str:
    """Cost and savings against all-precise, with the shadows' compute and without it."""
    total, shadow = usage["total"], usage["shadow"]["total"]
    baseline, cost, shadows = total["baseline_cost"], total["cost"], shadow["cost"]
    callers = cost - shadows
    return (
        f"Callers' answers: {total['requests'] - shadow['requests']} requests, cost "
        f"{callers:.2f} vs {baseline:.2f} all-precise (saved {1 - callers / baseline:.1%}). "
        f"Shadow answers and judge calls: {shadow['requests']} requests, cost {shadows:.2f} "
        f"({shadows / baseline:.1%} of the all-precise cost). With them counted: cost "
        f"{cost:.2f} vs {baseline:.2f} (saved {1 - cost / baseline:.1%})."
    )


def main() -> int:
    """Run the stack, send the traffic, print and write the admin views."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--shadow", type=float, default=0.05, help="shadow ratio, both ways")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "shadow.md")
    args = parser.parse_args()
    rows = [json.loads(line) for line in DATASET.read_text(encoding="utf-8").splitlines()]
    prompts = [r["prompt"] for r in random.Random(7).sample(rows, min(args.requests, len(rows)))]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        labels = work / "labels.jsonl"
        labels.write_text(
            "".join(json.dumps({"prompt": r["prompt"], "label": r["label"]}) + "\n" for r in rows),
            encoding="utf-8",
        )
        sim = [
            sys.executable,
            "-m",
            "simulator",
            "--latency-scale",
            "0.05",
            "--quality-file",
            str(labels),
            "--max-model-len",
            "32768",
        ]
        fast_port, precise_port, gateway_port = free_port(), free_port(), free_port()
        fast = start(
            [*sim, "--profile", "fast", "--port", str(fast_port), "--weak"], work / "f.log"
        )
        precise = start([*sim, "--profile", "precise", "--port", str(precise_port)], work / "p.log")
        config = {
            "auth": {"enabled": False, "admin_token": ADMIN},
            "tiers": {
                "fast": {"model": "tiergate-fast", "replicas": [f"http://127.0.0.1:{fast_port}"]},
                "precise": {
                    "model": "tiergate-precise",
                    "replicas": [f"http://127.0.0.1:{precise_port}"],
                },
            },
            "router": {
                "shadow": {
                    "fast_ratio": args.shadow,
                    "precise_ratio": args.shadow,
                    "max_concurrent": 8,
                    # one tenant (auth off): the ratio alone decides, as before the budget
                    "tenant_samples_per_minute": None,
                }
            },
            "telemetry": {"access_log": False},
        }
        (work / "gw.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        gateway = start(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(work / "gw.yaml"),
                "--port",
                str(gateway_port),
                "--workers",
                "1",
            ],
            work / "g.log",
        )
        try:
            for port in (fast_port, precise_port):
                wait(f"http://127.0.0.1:{port}/health")
            url = f"http://127.0.0.1:{gateway_port}"
            wait(url + "/readyz")
            statuses = asyncio.run(load(url, prompts, args.concurrency))
            time.sleep(2)  # the last shadows finish
            routing = admin(url + "/admin/routing")
            usage = admin(url + "/admin/usage?window=1h&by=tier")
        finally:
            for proc in (gateway, fast, precise):
                proc.terminate()
                proc.wait(timeout=10)
    command = (
        f".venv/bin/python bench/shadow/run.py --requests {args.requests} --shadow {args.shadow}"
    )
    report = (
        f"# Shadow evaluation and savings on the simulator\n\n`{command}`\n\n"
        f"Statuses: {statuses}\n\n{summary(usage)}\n\n## GET /admin/routing\n\n```json\n"
        f"{json.dumps(routing, indent=2)}\n```\n\n## GET /admin/usage?window=1h&by=tier\n\n"
        f"```json\n{json.dumps(usage, indent=2)}\n```\n"
    )
    args.out.write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
