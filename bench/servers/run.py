"""Compare HTTP server candidates for the gateway: plain-path throughput and hostile clients.

    .venv/bin/python -m bench.servers.run                 # every candidate, 5 s points
    .venv/bin/python -m bench.servers.run --quick --servers guarded,httptools

Every candidate serves the same app (the ``plain`` overhead variant) in front of the same
fixed-response upstream, pinned like bench/overhead (proxy on CPU 0, wrk + upstream on CPU 1).
Candidates run in rounds (each point once per round, the order rotated), so a noisy minute on
a shared machine hits all of them; the table keeps the best round per point and says the
spread. Then each faces P1 (a header streamed for ``--p1-seconds``) and P3 (``--p3-count``
slow clients of each kind, counted after ``--p3-hold``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import yaml

from bench.harness.legs import Placement, start_fixed_upstream
from bench.harness.processes import Service, free_port, http_answers
from bench.harness.wrk import WrkResult, WrkRunner, ensure_wrk, lua_script
from bench.overhead.variants import VARIANTS, gateway_config
from bench.servers.attacks import growing_header, slow_clients
from bench.servers.candidate import SERVERS

# Short deadlines so P3 finishes in seconds; the throughput points do not depend on them.
_SERVER = {"head_timeout_s": 5.0, "body_timeout_s": 5.0, "idle_timeout_s": 5.0}


def _start(server: str, config: Path, workdir: Path, pin: Placement) -> Service:
    port = free_port()
    cmd = [
        *pin.proxy,
        sys.executable,
        "-m",
        "bench.servers.candidate",
        "--server",
        server,
        "--config",
        str(config),
        "--port",
        str(port),
    ]
    service = Service(server, cmd, port, workdir / f"{server}.log", boost=pin.boosted)
    service.start(http_answers(f"http://127.0.0.1:{port}/livez"), 60)
    return service


def _throughput(
    wrk: WrkRunner, url: str, body: dict[str, object], duration: float
) -> dict[str, WrkResult]:
    script = lua_script(body, None)
    return {f"c{c}": wrk.run(url, script, c, duration) for c in (1, 16, 64)}


def _row(name: str, rounds: list[dict[str, WrkResult]]) -> str:
    p50 = min(r["c1"].p50_ms for r in rounds)
    best = {k: max(r[k].rps for r in rounds) for k in ("c16", "c64")}
    low = {k: min(r[k].rps for r in rounds) for k in ("c16", "c64")}
    errors = sum(r[k].errors + r[k].non_2xx for r in rounds for k in r)
    return (
        f"| {name} | {p50:.2f} ms | {best['c16']:,.0f} (low {low['c16']:,.0f}) | "
        f"{best['c64']:,.0f} (low {low['c64']:,.0f}) | {errors} |"
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--quick", action="store_true", help="2 s points, one round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--p1-seconds", type=float, default=10.0)
    p.add_argument("--p3-count", type=int, default=100)
    p.add_argument("--p3-hold", type=float, default=15.0)
    p.add_argument("--skip-attacks", action="store_true")
    p.add_argument(
        "--default-deadlines",
        action="store_true",
        help="the production server: defaults (10 s head/body) instead of 5 s",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print a Markdown report."""
    args = _parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if "granian" in servers and importlib.util.find_spec("granian") is None:
        print("granian is not installed here: skipped (pip install granian to include it)")
        servers.remove("granian")
    rounds, duration = (1, 2.0) if args.quick else (args.rounds, args.duration)
    pin = Placement.build(pin=True, boost=True)
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-servers-"))
    wrk = WrkRunner(ensure_wrk(), workdir, pin.load, pin.boosted)
    upstream = start_fixed_upstream(workdir, pin)
    variant = VARIANTS["plain"]
    config = gateway_config(variant, upstream.base_url, upstream.model, workdir, None)
    if not args.default_deadlines:
        config["server"] = _SERVER
    config_path = workdir / "tiergate.yaml"
    config_path.write_text(yaml.safe_dump(config))
    body = {
        "model": variant.request_model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello in five words."}],
    }
    results: dict[str, list[dict[str, WrkResult]]] = {s: [] for s in servers}
    attacks: dict[str, str] = {}
    try:
        for round_no in range(rounds):
            order = servers[round_no % len(servers) :] + servers[: round_no % len(servers)]
            for server in order:
                service = _start(server, config_path, workdir, pin)
                try:
                    url = f"http://127.0.0.1:{service.port}/v1/chat/completions"
                    results[server].append(_throughput(wrk, url, body, duration))
                    if round_no == 0 and not args.skip_attacks:
                        p1 = growing_header(service.port, args.p1_seconds)
                        p3 = slow_clients(service.port, args.p3_count, args.p3_hold)
                        attacks[server] = (
                            f"| {server} | {p1.livez_p50_ms:.1f} / {p1.livez_max_ms:.1f} ms | "
                            f"{p1.sent_kib:,} KiB, {p1.answer} | {json.dumps(p3)} |"
                        )
                finally:
                    service.stop()
    finally:
        upstream.main.stop()
    print(f"# HTTP server candidates ({rounds} round(s) of {duration:.0f} s points)\n")
    print("| server | c=1 p50 | c=16 req/s | c=64 req/s | errors |\n|---|---:|---:|---:|---:|")
    for server in servers:
        print(_row(server, results[server]))
    if attacks:
        print(
            f"\n| server | P1 /livez p50 / max while a header streams {args.p1_seconds:.0f} s "
            f"| P1 what the streamer got | P3 still open after {args.p3_hold:.0f} s "
            f"(of {args.p3_count} each) |\n|---|---:|---|---|"
        )
        for server in servers:
            print(attacks.get(server, f"| {server} | - | - | - |"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
