"""Key-id timing oracle check: how long a 401 takes for an unknown key id vs a known id.

    .venv/bin/python -m bench.keys.timing            # starts redis-server + tiergate serve
    .venv/bin/python -m bench.keys.timing --tries 1000 --rounds 3

Each round sends ``--tries`` requests of each kind over one keep-alive connection,
interleaved in random order (so drift and noise hit both kinds alike), and prints the median
latency of each and their difference in microseconds. Issue 11 (P11) asks for medians within
20 µs over 1,000 tries; before the fix unknown ids cost one Redis GET each (~150 µs more).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from redis.asyncio import Redis

from bench.harness.processes import Service, free_port, http_answers, redis_answers
from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import create_key
from policies.principal import KeyPolicy

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMIT_US = 20.0


@dataclass(frozen=True, slots=True)
class Medians:
    """Median 401 latency of each kind of wrong key, in microseconds."""

    unknown_id_us: float
    known_id_us: float

    @property
    def gap_us(self) -> float:
        """How much longer an unknown id takes (negative: shorter)."""
        return self.unknown_id_us - self.known_id_us


def _probe(conn: http.client.HTTPConnection, token: str) -> int:
    start = time.perf_counter_ns()
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    response.read()
    elapsed = time.perf_counter_ns() - start
    if response.status != 401:
        raise RuntimeError(f"expected 401 for a wrong key, got {response.status}")
    return elapsed


def measure(
    host: str,
    port: int,
    known_id: str,
    *,
    tries: int = 1000,
    warmup: int = 50,
    seed: int | None = None,
) -> Medians:
    """Interleaved tries of an unknown id and of ``known_id`` with a wrong secret."""
    rng = random.Random(seed)
    unknown = f"tg-{'q' * 10}-" + "W" * 43  # a well-formed key whose id no store has
    wrong = f"tg-{known_id}-" + "W" * 43
    conn = http.client.HTTPConnection(host, port, timeout=10)
    times: dict[str, list[int]] = {unknown: [], wrong: []}
    try:
        for _ in range(warmup):
            _probe(conn, unknown)
            _probe(conn, wrong)
        for _ in range(tries):
            pair = [unknown, wrong]
            rng.shuffle(pair)
            for token in pair:
                times[token].append(_probe(conn, token))
    finally:
        conn.close()
    return Medians(statistics.median(times[unknown]) / 1000, statistics.median(times[wrong]) / 1000)


async def _new_key(redis_url: str) -> str:
    client = Redis.from_url(redis_url)
    try:
        record, _ = await create_key(RedisKeyStore(client), "timing", KeyPolicy(), now=time.time())
    finally:
        await client.aclose()
    return record.key_id


def _stack(workdir: Path) -> tuple[Service, Service, str]:
    """redis-server and a gateway with Redis keys; returns them and the known key id."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (make redis-server)")
    rport = free_port()
    redis = Service(
        "redis",
        [binary, "--port", str(rport), "--save", "", "--appendonly", "no"],
        rport,
        workdir / "redis.log",
    )
    redis.start(redis_answers(rport))
    url = f"redis://127.0.0.1:{rport}/0"
    known_id = asyncio.run(_new_key(url))
    config = {
        "auth": {"store": "redis"},
        "redis": {"url": url},
        "telemetry": {"access_log": False},
        "tiers": {
            "fast": {"model": "tiergate-fast", "replicas": ["http://127.0.0.1:9"]},
            "precise": {"model": "tiergate-precise", "replicas": ["http://127.0.0.1:9"]},
        },
    }
    (workdir / "tiergate.yaml").write_text(yaml.safe_dump(config))
    gport = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(workdir / "tiergate.yaml"),
        "--port",
        str(gport),
        "--workers",
        "1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TIERGATE_CONFIG"}
    gateway = Service("tiergate", cmd, gport, workdir / "tiergate.log", env=env)
    gateway.start(http_answers(f"http://127.0.0.1:{gport}/livez"))
    return redis, gateway, known_id


def main(argv: list[str] | None = None) -> int:
    """Start a stack, print the medians of each round; exit 1 if no round is within 20 µs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tries", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tiergate-timing-") as tmp:
        redis, gateway, known_id = _stack(Path(tmp))
        try:
            gaps = []
            for round_no in range(1, args.rounds + 1):
                m = measure("127.0.0.1", gateway.port, known_id, tries=args.tries)
                gaps.append(abs(m.gap_us))
                print(
                    f"round {round_no}: unknown id median {m.unknown_id_us:.1f} us, known id + "
                    f"wrong secret median {m.known_id_us:.1f} us, gap {m.gap_us:+.1f} us "
                    f"({args.tries} tries each, interleaved)"
                )
        finally:
            gateway.stop()
            redis.stop()
    return 0 if min(gaps) <= LIMIT_US else 1


if __name__ == "__main__":
    raise SystemExit(main())
