"""The simulator's configuration and the one state object every handler shares."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from simulator.engine import Engine, EngineConfig
from simulator.faults import FaultInjector, FaultRates
from simulator.flavors import FLAVORS
from simulator.planner import Planner, PlannerConfig
from simulator.prefix_cache import PrefixCache
from simulator.profiles import Profile
from simulator.quality import QualityModel
from simulator.serial import SerialModel

BLOCK_SIZE = 16
# The vLLM releases whose differing behaviours the simulator reproduces.
VLLM_VERSIONS = ("0.11", "current")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything the command line sets."""

    profile: Profile
    model: str
    replica: str
    seed: int = 0
    max_num_seqs: int = 64
    max_queue: int | None = None
    queue_full_status: int = 503
    kv_blocks: int = 2048
    max_model_len: int = 8192
    latency_scale: float = 1.0
    time_factor_under_load: float = 2.0
    jitter: float = 0.2
    # Seconds each request waits as "deferred" before it may be scheduled.
    deferred_s: float = 0.0
    # vLLM's --enable-server-load-tracking: GET /load reports the requests in flight.
    server_load_tracking: bool = False
    echo: bool = False
    # None: a chat request without max_tokens generates to the end of the context, as vLLM.
    output_tokens: int | None = None
    legacy_metrics: bool = False
    label: str = ""
    faults: FaultRates = field(default_factory=FaultRates)
    quality: QualityModel | None = None
    # vLLM behaviours that differ by release: "0.11" or "current" (see simulator/serving.py).
    vllm_version: str = "current"
    # vLLM's --api-key (several keys: any one is accepted); empty: /v1 is open.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # VLLM_SERVER_DEV_MODE=1: /sleep, /wake_up, /is_sleeping... are served.
    dev_mode: bool = False
    # The routes vLLM serves only behind a flag (profiler, tokenizer info, fault tolerance).
    gated_routes: bool = False
    prompt_tokens_details: bool = False
    # vLLM's --reasoning-parser: the first N output tokens of a chat answer are thinking.
    reasoning_tokens: int = 0
    flavor: str = "vllm"
    health_delay_s: float | None = None  # None: the flavour's own
    metrics: str = "auto"  # on | off | auto (the flavour's default)
    # One generation at a time (llama-cpp-python): off | wait | interrupt (simulator/serial.py).
    serial: str = "off"


class SimState:
    """Engine, planner, faults and the counters behind ``/sim/stats``."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.flavor = FLAVORS[config.flavor]
        self.model = config.model
        self.replica = config.replica
        self.created = int(time.time())
        cache = PrefixCache(config.kv_blocks, BLOCK_SIZE)
        engine_config = EngineConfig(
            profile=config.profile,
            max_num_seqs=config.max_num_seqs,
            max_queue=config.max_queue,
            latency_scale=config.latency_scale,
            time_factor_under_load=config.time_factor_under_load,
            jitter=config.jitter,
            deferred_s=config.deferred_s,
        )
        self.engine = Engine(engine_config, cache, config.seed + 1)
        self.planner = Planner(
            PlannerConfig(
                config.model,
                config.max_model_len,
                config.kv_blocks,
                BLOCK_SIZE,
                config.output_tokens,
                config.echo,
                config.quality,
                config.label,
            ),
            config.seed + 2,
        )
        self.faults = FaultInjector(FaultRates(**config.faults.as_dict()), config.seed + 3)
        self.healthy = True
        # vLLM's sleep mode: 0 awake, 1 weights offloaded, 2 weights and KV cache discarded.
        self.sleep_level = 0
        self.requests_total = 0
        self.last_traceparent: str | None = None
        self.last_body: bytes | None = None
        self.last_request_id: str | None = None
        # Engine request ids in flight (vLLM 0.11 refuses a second one with the same id).
        self.running_ids: set[str] = set()
        self.serial = SerialModel(config.serial)

    def rename(self, replica: str) -> None:
        """Set the replica name once the port is known."""
        self.replica = replica

    def stats(self) -> dict[str, Any]:
        """The ``/sim/stats`` document."""
        engine = self.engine
        last_request: Any = None
        if self.last_body is not None:
            try:
                last_request = msgspec.json.decode(self.last_body)
            except msgspec.DecodeError:
                last_request = self.last_body.decode("utf-8", "replace")
        return {
            "replica": self.replica,
            "model": self.model,
            "requests_total": self.requests_total,
            "aborts_total": engine.aborts,
            "running": engine.running,
            "waiting": len(engine.waiting) + engine.deferred,
            "admission_rejections": dict(engine.rejections),
            "kv_cache_usage": engine.cache.usage(),
            "prefix_cache_queries": engine.metrics.prefix_queries,
            "prefix_cache_hits": engine.metrics.prefix_hits,
            "finished": dict(engine.metrics.finished),
            "healthy": self.healthy,
            "sleep_level": self.sleep_level,
            "last_traceparent": self.last_traceparent,
            "last_request_id": self.last_request_id,
            "last_request": last_request,
            "faults": self.faults.rates.as_dict(),
            "serial_interrupted": self.serial.interrupted,
        }

    def reset(self) -> None:
        """Zero the counters and histograms and forget unused cached prefixes."""
        self.requests_total = 0
        self.engine.aborts = 0
        self.engine.rejections.clear()
        self.engine.metrics.reset()
        self.engine.cache.drop_unused()
        self.last_traceparent = None
        self.last_body = None
