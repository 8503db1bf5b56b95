"""``--workers 1`` against ``--workers 2`` at c=64 on the plain path, with each process's CPU share.

    .venv/bin/python -m bench.servers.workers --duration 10

Nothing is pinned (the workers must be free to use every core); wrk and the fixed upstream
share the machine with the gateway, so on 2 cores the numbers show the split of CPU rather
than scaling. CPU share = (user + system time during the run) / wall time, per process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

from bench.harness.legs import Placement, start_fixed_upstream
from bench.harness.processes import Service, free_port, http_answers
from bench.harness.wrk import WrkRunner, ensure_wrk, lua_script
from bench.overhead.variants import VARIANTS, gateway_config

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _tree(pid: int) -> list[int]:
    found = [pid]
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        found += _tree(int(child))
    return found


def _point(
    workers: int,
    config: Path,
    workdir: Path,
    wrk: WrkRunner,
    *,
    body: dict[str, object],
    duration: float,
    upstream_pid: int,
) -> str:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    service = Service(f"tiergate-w{workers}", cmd, port, workdir / f"w{workers}.log")
    service.start(http_answers(f"http://127.0.0.1:{port}/livez"), 90)
    try:
        assert service.proc is not None
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        wrk.run(url, lua_script(body, None), 64, 2)  # warm-up
        pids = {f"gateway pid {p}": p for p in _tree(service.proc.pid)}
        pids["upstream"] = upstream_pid
        before = {name: _cpu_s(pid) for name, pid in pids.items()}
        result = wrk.run(url, lua_script(body, None), 64, duration)
        shares = {n: (_cpu_s(p) - before[n]) / result.duration_s for n, p in pids.items()}
    finally:
        service.stop()
    share_text = ", ".join(f"{n}: {s:.0%}" for n, s in shares.items())
    return (
        f"| {workers} | {result.rps:,.0f} | {result.p50_ms:.2f} ms | "
        f"{result.errors + result.non_2xx} | {share_text} |"
    )


def main(argv: list[str] | None = None) -> int:
    """Run both points and print a Markdown table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-workers-bench-"))
    pin = Placement.build(pin=False, boost=False)
    wrk = WrkRunner(ensure_wrk(), workdir, pin.load, pin.boosted)
    upstream = start_fixed_upstream(workdir, pin)
    variant = VARIANTS["plain"]
    config = workdir / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(gateway_config(variant, upstream.base_url, upstream.model, workdir, None))
    )
    body = {
        "model": variant.request_model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello in five words."}],
    }
    assert upstream.main.proc is not None
    rows = []
    try:
        for workers in (1, 2):
            rows.append(
                _point(
                    workers,
                    config,
                    workdir,
                    wrk,
                    body=body,
                    duration=args.duration,
                    upstream_pid=upstream.main.proc.pid,
                )
            )
    finally:
        upstream.main.stop()
    print(
        f"| workers | c=64 req/s | p50 | errors | CPU share ({args.duration:.0f} s, "
        f"{os.cpu_count()} CPUs; wrk not shown) |\n|---:|---:|---:|---:|---|"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
