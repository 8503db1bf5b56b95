"""Round-trip time to a server on the same vCPU and on the other one: the machine's wake-up cost.

Usage: ``.venv/bin/python bench/harness/wakeup.py [--requests 5000]``

A ``redis-server`` (the one the benchmarks start) is pinned to CPU 0, then to CPU 1; this
process, pinned to CPU 0, sends ``PING`` over a plain blocking socket and waits for ``+PONG``,
one at a time, and reports the median round trip of each placement. Nothing of TierGate is
involved: the difference between the two medians is what a request path pays for each
round trip to a process on an idle vCPU (on a virtual machine, waking a halted vCPU goes
through the hypervisor). The overhead benchmark puts Redis, the upstream and wrk on CPU 1 and
the proxy alone on CPU 0, so every Redis round trip of the ``full`` variant pays it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness.processes import free_port  # noqa: E402  # after the path fix


def round_trip_us(cpu: int, requests: int) -> float:
    """Median PING round trip (µs) to a redis-server pinned to ``cpu``, from CPU 0."""
    redis = shutil.which("redis-server")
    if redis is None:
        raise SystemExit("redis-server is needed (make redis-server)")
    port = free_port()
    cmd = ["taskset", "-c", str(cpu), redis, "--port", str(port)]
    cmd += ["--save", "", "--appendonly", "no"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        sock = _connect(port)
        with sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                sock.sendall(b"PING\r\n")
                sock.recv(64)
                times.append(time.perf_counter() - started)
        return statistics.median(times[requests // 10 :]) * 1e6
    finally:
        server.kill()
        server.wait()


def _connect(port: int) -> socket.socket:
    for _ in range(100):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"redis-server did not listen on {port}")


def main(argv: list[str] | None = None) -> int:
    """Print both medians and their difference."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=5000)
    args = p.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs")
    os.sched_setaffinity(0, {0})
    same = round_trip_us(0, args.requests)
    other = round_trip_us(1, args.requests)
    print(f"PING round trip, median of {args.requests}: same vCPU {same:.0f} µs, ", end="")
    print(f"other vCPU {other:.0f} µs (+{other - same:.0f} µs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
