"""TierGate configurations the overhead benchmark can run: every gateway knob lives here.

``plain`` is the bare proxy path (no auth, in-memory everything, router bypassed by asking for
the ``fast`` tier). ``full`` turns on what production runs: API keys from a file, the Redis
rate limiter, the learned router (``model: auto``), tracing at 10 % sampling and logs to a file.
``full-trace100`` is ``full`` with every request traced, to report tracing's own overhead.
``router-shadow5`` is ``router`` with 5 % of requests in each direction shadowed on the other
tier (the same upstream here), to show a shadow costs the caller nothing it can see.
Traced variants export spans over OTLP/HTTP to a local sink (a second fixed-response server,
which answers 200 to every POST), so export costs what it costs against a fast collector.
Adjust the dictionaries below when the gateway's settings change; nothing else in the
benchmark knows their shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIER_MAX_TOKENS_CAP = 4096
# The gateway's request-body limit, set explicitly: the memory phase sends bodies just under
# it (read, then refused) and over it (413).
MAX_BODY_BYTES = 4 * 1024 * 1024
# Far above the benchmark's 64 connections, so the gateway's own limiter never queues.
TIER_MAX_CONCURRENCY = 1024


@dataclass(frozen=True)
class Variant:
    """What a gateway variant needs around it and which model name its clients ask for."""

    name: str
    request_model: str
    needs_key: bool
    needs_redis: bool
    trace_sample_ratio: float | None
    # Share of requests shadowed on the other tier, in each direction (issue 17's latency check).
    shadow_ratio: float = 0.0


VARIANTS: dict[str, Variant] = {
    "plain": Variant("plain", "fast", needs_key=False, needs_redis=False, trace_sample_ratio=None),
    "full": Variant("full", "auto", needs_key=True, needs_redis=True, trace_sample_ratio=0.1),
    # One feature at a time on top of plain, to show what each costs.
    "router": Variant(
        "router", "auto", needs_key=False, needs_redis=False, trace_sample_ratio=None
    ),
    # The router variant with 5 % of requests also answered by the other tier, off the path.
    "router-shadow5": Variant(
        "router-shadow5",
        "auto",
        needs_key=False,
        needs_redis=False,
        trace_sample_ratio=None,
        shadow_ratio=0.05,
    ),
    "auth-redis": Variant(
        "auth-redis", "fast", needs_key=True, needs_redis=True, trace_sample_ratio=None
    ),
    "traced": Variant("traced", "fast", needs_key=False, needs_redis=False, trace_sample_ratio=0.1),
    "full-trace100": Variant(
        "full-trace100", "auto", needs_key=True, needs_redis=True, trace_sample_ratio=1.0
    ),
}


def _tier(model: str, upstream_url: str) -> dict[str, Any]:
    return {
        "model": model,
        "replicas": [upstream_url],
        "max_tokens_cap": TIER_MAX_TOKENS_CAP,
        "max_concurrency": TIER_MAX_CONCURRENCY,
    }


def gateway_config(
    variant: Variant,
    upstream_url: str,
    upstream_model: str,
    workdir: Path,
    redis_url: str | None,
) -> dict[str, Any]:
    """The YAML document (as a dict) that ``tiergate serve --config`` reads for a variant."""
    config: dict[str, Any] = {
        "tiers": {
            "fast": _tier(upstream_model, upstream_url),
            "precise": _tier(upstream_model, upstream_url),
        },
        "auth": {"enabled": False},
        "server": {"max_body_bytes": MAX_BODY_BYTES},
    }
    if variant.shadow_ratio:
        ratio = variant.shadow_ratio
        config["router"] = {"shadow": {"fast_ratio": ratio, "precise_ratio": ratio}}
    if variant.needs_key:
        config["auth"] = {"enabled": True, "store": "file", "keys_file": str(keys_file(workdir))}
    if variant.needs_redis:
        if redis_url is None:
            raise ValueError(f"variant {variant.name} needs a Redis URL")
        config["ratelimit"] = {"backend": "redis"}
        config["redis"] = {"url": redis_url}
    if variant.trace_sample_ratio is not None:
        config["telemetry"] = {
            "tracing": True,
            "trace_sample_ratio": variant.trace_sample_ratio,
            "log_file": str(workdir / "tiergate-access.log"),
        }
    return config


def gateway_env(variant: Variant, trace_sink_url: str | None) -> dict[str, str]:
    """Environment for the gateway: where traced variants export spans (OTLP over HTTP)."""
    if variant.trace_sample_ratio is None or trace_sink_url is None:
        return {}
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": trace_sink_url,
    }


def keys_file(workdir: Path) -> Path:
    """Where the benchmark keeps the API keys file of the auth-enabled variants."""
    return workdir / "tiergate-keys.yaml"


def key_create_command(tiergate_bin: str, workdir: Path, tiers: str | None = None) -> list[str]:
    """Command that creates a benchmark API key (all tiers, or ``tiers``); stdout's last line."""
    only = ["--tiers", tiers] if tiers else []
    return [
        tiergate_bin,
        "keys",
        "create",
        "--keys-file",
        str(keys_file(workdir)),
        "--tenant",
        "bench",
        "--name",
        "bench",
        "--rpm",
        "100000000",
        "--tpm",
        "100000000000",
        *only,
    ]
