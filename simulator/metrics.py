"""Engine counters and histograms, rendered in Prometheus text format with vLLM's names."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Bucket bounds follow vLLM's V1 engine (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    """A cumulative-on-render Prometheus histogram."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.count += times
        self.total += value * times

    def reset(self) -> None:
        """Forget every observation."""
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def render(self, name: str, labels: str, out: list[str]) -> None:
        """Append the ``_bucket``/``_sum``/``_count`` sample lines."""
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(running)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")


@dataclass(slots=True)
class EngineMetrics:
    """Everything the engine counts; gauges are read live from the engine at render time."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def reset(self) -> None:
        """Zero every counter and histogram."""
        self.prompt_tokens = self.generation_tokens = 0
        self.prefix_queries = self.prefix_hits = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        for histogram in (self.ttft, self.itl, self.e2e):
            histogram.reset()


@dataclass(frozen=True, slots=True)
class Gauges:
    """Live engine state sampled for one scrape."""

    running: int
    waiting: int
    kv_usage: float
    block_size: int
    num_gpu_blocks: int
    sleep_level: int = 0  # 0 awake, 1 weights offloaded, 2 everything discarded
    # Of ``waiting``: held back for another reason than capacity (the rest wait for capacity).
    waiting_deferred: int = 0
    # Requests the engine refused at admission, by reason.
    rejections: dict[str, int] = field(default_factory=dict)


_HELP: dict[str, tuple[str, str]] = {
    "vllm:num_requests_running": ("gauge", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("gauge", "Number of requests waiting to be processed."),
    "vllm:num_requests_waiting_by_reason": (
        "gauge",
        "Number of requests waiting, by reason: capacity (the engine is full) or deferred.",
    ),
    "vllm:admission_rejections": (
        "counter",
        "Requests rejected at admission (answered 503), by reason.",
    ),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:gpu_cache_usage_perc": (
        "gauge",
        "GPU KV-cache usage. 1 means 100 percent usage (deprecated).",
    ),
    "vllm:prefix_cache_queries_total": (
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    "vllm:prefix_cache_hits_total": (
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    "vllm:prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "vllm:generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "vllm:request_success_total": ("counter", "Count of successfully processed requests."),
    "vllm:time_to_first_token_seconds": (
        "histogram",
        "Histogram of time to first token in seconds.",
    ),
    "vllm:inter_token_latency_seconds": (
        "histogram",
        "Histogram of inter-token latency in seconds.",
    ),
    "vllm:e2e_request_latency_seconds": (
        "histogram",
        "Histogram of e2e request latency in seconds.",
    ),
    "vllm:cache_config_info": ("gauge", "Information of the LLMEngine CacheConfig"),
    "vllm:engine_sleep_state": (
        "gauge",
        "The engine's sleep state: 1 on the current state's label, 0 on the others",
    ),
}
_SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def _header(out: list[str], name: str) -> None:
    kind, text = _HELP[name]
    out.append(f"# HELP {name} {text}")
    out.append(f"# TYPE {name} {kind}")


def _sample(out: list[str], name: str, labels: str, value: float) -> None:
    _header(out, name)
    out.append(f"{name}{{{labels}}} {float(value)}")


def render(metrics: EngineMetrics, gauges: Gauges, model: str, *, legacy: bool) -> str:
    """The ``/metrics`` page: vLLM names, labels ``engine`` and ``model_name``."""
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    labels = f'engine="0",model_name="{escaped}"'
    out: list[str] = []
    _sample(out, "vllm:num_requests_running", labels, gauges.running)
    _sample(out, "vllm:num_requests_waiting", labels, gauges.waiting)
    _header(out, "vllm:num_requests_waiting_by_reason")
    by_reason = (
        ("capacity", gauges.waiting - gauges.waiting_deferred),
        ("deferred", gauges.waiting_deferred),
    )
    for reason, count in by_reason:
        out.append(
            f'vllm:num_requests_waiting_by_reason{{{labels},reason="{reason}"}} {float(count)}'
        )
    _header(out, "vllm:admission_rejections")
    for reason, count in sorted({"queue_full": 0, **gauges.rejections}.items()):
        out.append(
            f'vllm:admission_rejections{{model_name="{escaped}",reason="{reason}"}} {float(count)}'
        )
    _sample(out, "vllm:kv_cache_usage_perc", labels, gauges.kv_usage)
    if legacy:
        _sample(out, "vllm:gpu_cache_usage_perc", labels, gauges.kv_usage)
    _sample(out, "vllm:prefix_cache_queries_total", labels, metrics.prefix_queries)
    _sample(out, "vllm:prefix_cache_hits_total", labels, metrics.prefix_hits)
    _sample(out, "vllm:prompt_tokens_total", labels, metrics.prompt_tokens)
    _sample(out, "vllm:generation_tokens_total", labels, metrics.generation_tokens)
    _header(out, "vllm:request_success_total")
    for reason, count in metrics.finished.items():
        out.append(
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(count)}'
        )
    for name, histogram in (
        ("vllm:time_to_first_token_seconds", metrics.ttft),
        ("vllm:inter_token_latency_seconds", metrics.itl),
        ("vllm:e2e_request_latency_seconds", metrics.e2e),
    ):
        _header(out, name)
        histogram.render(name, labels, out)
    info = f'block_size="{gauges.block_size}",engine="0",num_gpu_blocks="{gauges.num_gpu_blocks}"'
    _sample(out, "vllm:cache_config_info", info, 1)
    _header(out, "vllm:engine_sleep_state")
    for level, state in enumerate(_SLEEP_STATES):
        value = 1.0 if level == gauges.sleep_level else 0.0
        out.append(f'vllm:engine_sleep_state{{{labels},sleep_state="{state}"}} {value}')
    return "\n".join(out) + "\n"
