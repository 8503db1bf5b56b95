"""CPU per request of the gateway's own request logic, without sockets or a backend.

Usage: ``.venv/bin/python bench/requestpath/run.py [--requests 20000] [--rounds 3]
[--profile] [--out bench/results/requestpath.md]``

The gateway is built in-process from the overhead benchmark's ``plain`` configuration
(``bench/overhead/variants.py``), with JSON access lines into a discarded stream, and its
``ProxyService.handle`` is called for the benchmark's small chat completion, followed by the
reply's ``after`` (metrics, access line, settlement), with the forwarder answering at once
from memory. Two settings: ``plain`` (no authentication, no limits) and ``keys`` (an API key
from a key file, with requests- and tokens-per-minute limits in the in-process limiter). The
figure is CPU time (``time.process_time``) per request, median of the rounds: the cost of
authentication, validation, field rules, routing, limits, prefix hashing and bookkeeping,
which ``bench/overhead`` measures only inside whole requests (HTTP parsing, the upstream
client and the sockets added). ``--profile`` adds cProfile's top functions (inflated, read the
shares).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import uvloop  # noqa: E402  # after the path fix
import yaml  # noqa: E402  # same

from bench.harness.markdown import report_head  # noqa: E402  # same
from bench.overhead.legs import create_key  # noqa: E402  # same
from bench.overhead.variants import VARIANTS, gateway_config, keys_file  # noqa: E402  # same
from gateway.composition import build_gateway  # noqa: E402  # same
from gateway.config.settings import load_settings  # noqa: E402  # same
from gateway.http.proxy import ProxyService  # noqa: E402  # same
from gateway.pipeline.events import NO_EVENTS, AttemptEvents  # noqa: E402  # same
from gateway.telemetry.logging import configure_logging  # noqa: E402  # same
from gateway.upstream.attempt import Opened  # noqa: E402  # same
from gateway.upstream.fair_queue import ANONYMOUS, Ticket  # noqa: E402  # same
from gateway.upstream.forwarding import Exchange, Forwarded, Forwarder  # noqa: E402  # same

T = TypeVar("T")
ANSWER = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"m",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the fixed '
    b'upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":7,'
    b'"total_tokens":19}}'
)
REQUEST = (
    b'{"model":"fast","messages":[{"role":"user","content":"Say hello in five words."}],'
    b'"max_tokens":16}'
)


class AnswerAtOnce(Forwarder):
    """The forwarder with the backend taken out: the first tier answers ``ANSWER`` at once."""

    async def forward(
        self,
        path: str,
        body: dict[str, Any],
        tiers: Sequence[str],
        prefix_blocks: Sequence[int] = (),
        events: AttemptEvents = NO_EVENTS,
        *,
        ticket: Ticket = ANONYMOUS,
    ) -> Forwarded:
        """Skip replica choice, retries and the upstream client."""
        route = self.routes[tiers[0]]
        opened = Opened(200, "application/json", ANSWER, None)
        return Forwarded(Exchange(opened, route.pool.replicas[0], route.pool), tiers[0])


class Inbound:
    """A request already read: headers and body in memory."""

    client_host: str | None = None

    def __init__(self, headers: Mapping[str, str]) -> None:
        self.headers = headers

    async def read_body(self) -> bytes:
        """The benchmark's body."""
        return REQUEST

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """No client to lose."""
        return await work


def service_for(setting: str, workdir: Path) -> tuple[ProxyService, Inbound]:
    """The gateway's service for ``plain`` or ``keys``, and the request to send it."""
    config = gateway_config(VARIANTS["plain"], "http://127.0.0.1:9", "m", workdir, None)
    headers = {"content-type": "application/json", "content-length": str(len(REQUEST))}
    if setting == "keys":
        headers["authorization"] = "Bearer " + create_key(workdir)
        config["auth"] = {"enabled": True, "store": "file", "keys_file": str(keys_file(workdir))}
    path = workdir / f"{setting}.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = build_gateway(load_settings(path))
    service = gateway.service
    forwarder = service.forwarder
    service.forwarder = AnswerAtOnce(forwarder.upstream, forwarder.routes, forwarder.policy)
    return service, Inbound(headers)


async def run(service: ProxyService, inbound: Inbound, requests: int) -> float:
    """CPU µs per request over ``requests`` calls of handle and the reply's after-work."""

    async def one() -> None:
        reply = await service.handle(inbound, "chat", "/v1/chat/completions")
        if reply.status != 200 or reply.finish is None:
            raise SystemExit(f"the request failed: {reply.status} {reply.body[:300]!r}")
        reply.finish()
        if reply.after is not None:
            await reply.after()

    started = time.process_time()
    for _ in range(requests):
        await one()
    return (time.process_time() - started) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    """Measure both settings, print and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="add cProfile's top functions")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/requestpath.md")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    if args.requests < 10 or args.rounds < 1:
        p.error("--requests >= 10 and --rounds >= 1")
    sink = configure_logging(load_settings().telemetry, stream=io.StringIO())
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-requestpath-"))
    rows: list[str] = []
    profiles: list[str] = []
    try:
        for setting in ("plain", "keys"):
            service, inbound = service_for(setting, workdir)
            cpu = [uvloop.run(run(service, inbound, args.requests)) for _ in range(args.rounds)]
            rows.append(f"| {setting} | {statistics.median(cpu):.1f} | {min(cpu):.1f} |")
            sink._lines.clear()  # the lines are not what is measured
            if args.profile:
                profiles += profile(service, inbound, args.requests, setting)
    finally:
        sink.close()
    command = " ".join([".venv/bin/python", "bench/requestpath/run.py", *given])
    text = "\n".join(
        [
            *report_head("The request path's own logic: CPU per request, in-process", command),
            f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; Python {sys.version.split()[0]}; "
            f"{args.requests:,} requests per round, {args.rounds} rounds",
            "- handle + after, forwarder answering at once (no sockets, no backend)",
            "",
            "| setting | CPU µs / request (median) | best round |",
            "|---|---:|---:|",
            *rows,
            *profiles,
        ]
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0


def profile(service: ProxyService, inbound: Inbound, requests: int, setting: str) -> list[str]:
    """cProfile's 25 functions with the most own time, µs per request (inflated by cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    uvloop.run(run(service, inbound, requests))
    profiler.disable()
    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # untyped table
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:25]
    lines = ["", f"cProfile, `{setting}` (own µs per request, inflated):", ""]
    lines += ["| function | calls / request | own µs |", "|---|---:|---:|"]
    for (path, line, name), (_, calls, own, _, _) in rows:
        where = path.split(str(REPO_ROOT) + "/")[-1].split("site-packages/")[-1]
        lines.append(
            f"| `{where}:{line} {name}` | {calls / requests:.2f} | {own / requests * 1e6:.1f} |"
        )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
