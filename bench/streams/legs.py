"""The streams benchmark's legs: the fixed-rate upstream (direct) and every proxy in front of
it, started with the overhead benchmark's helpers (same versions, same placement)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.legs import UPSTREAM_MODEL, Leg, Placement, start_service
from bench.harness.processes import Service, free_port
from bench.overhead.legs import start_litellm, start_tiergate
from bench.overhead.peers import start_nginx, start_portkey, start_vllm_router
from bench.overhead.variants import VARIANTS

# Above the largest ladder step, so TierGate's own per-replica limit never queues a stream.
STREAM_CONCURRENCY = 20_000
ALL_LEGS = (
    "direct",
    "nginx",
    "tiergate-plain",
    "tiergate-full",
    "tiergate-2w",
    "vllm-router",
    "portkey",
    "litellm",
)


@dataclass(frozen=True)
class UpstreamPace:
    """The upstream's default pace for every stream of the run."""

    tokens_per_s: float
    first_token_ms: float


def start_stream_upstream(workdir: Path, pin: Placement, pace: UpstreamPace) -> Leg:
    """``bench/streams/upstream.py`` on the load core; answers are as long as ``max_tokens``."""
    port = free_port()
    script = Path(__file__).with_name("upstream.py")
    cmd = [*pin.load, sys.executable, str(script), "--port", str(port), "--model", UPSTREAM_MODEL]
    cmd += ["--tokens", "100000", "--tokens-per-s", str(pace.tokens_per_s)]
    cmd += ["--first-token-ms", str(pace.first_token_ms)]
    log = workdir / "stream-upstream.log"
    service = start_service(
        Service("stream-upstream", cmd, port, log, boost=pin.boosted), "/health"
    )
    return Leg("direct (fixed-rate upstream)", f"http://127.0.0.1:{port}", UPSTREAM_MODEL, None,
               service)  # fmt: skip


def streaming_tiers(config: dict[str, Any]) -> None:
    """Let every tier hold the whole ladder at once (the default timeouts fit the answers)."""
    for tier in config["tiers"].values():
        tier["max_concurrency"] = STREAM_CONCURRENCY


def starter(
    name: str, launcher: tuple[str, ...] = (), revision: str = ""
) -> Callable[[Leg, Path, Placement], Leg]:
    """The function that starts leg ``name`` in front of the upstream.

    A TierGate leg named ``NAME@REV`` runs revision ``REV``'s code through ``launcher`` (a
    worktree first on the path, as ``bench/overhead/ab.py`` does), for a same-run A/B.
    """
    # Every overhead variant is a leg (tiergate-router, tiergate-traced...: one feature at a
    # time, to find what a full-path figure is made of), plus plain on two workers.
    tiergate = {f"tiergate-{v}": (v, 1) for v in VARIANTS} | {"tiergate-2w": ("plain", 2)}
    base = name.split("@", 1)[0]
    if base in tiergate:
        variant, workers = tiergate[base]

        def start(upstream: Leg, workdir: Path, pin: Placement) -> Leg:
            leg = start_tiergate(VARIANTS[variant], upstream, workdir, pin, launcher,
                                 workers=workers, adjust=streaming_tiers)  # fmt: skip
            if revision:
                leg.name += f" @ {revision}"
            return leg

        return start
    peers: dict[str, Callable[[Leg, Path, Placement], Leg]] = {
        "nginx": lambda up, wd, pin: start_nginx(up, wd, pin, streaming=True),
        "vllm-router": start_vllm_router,
        "portkey": start_portkey,
        "litellm": start_litellm,
    }
    if name not in peers:
        known = ", ".join((*ALL_LEGS, *tiergate))
        raise ValueError(f"unknown leg {name!r}; known: {known}")
    return peers[name]
