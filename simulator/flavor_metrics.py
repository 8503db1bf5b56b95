"""``/metrics`` pages in each flavour's own names (vLLM's live in :mod:`simulator.metrics`).

Only the samples a gateway reads, plus a few counters each server always shows, with the
types and labels the servers use: SGLang labels by ``model_name``; llama.cpp's llama-server
and TGI use no labels.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.metrics import EngineMetrics, Gauges, render

Renderer = Callable[..., str]


def _page(samples: list[tuple[str, str, str, float]]) -> str:
    out: list[str] = []
    for name, kind, text, value in samples:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name} {float(value)}")
    return "\n".join(out) + "\n"


def render_sglang(metrics: EngineMetrics, gauges: Gauges, model: str, *, legacy: bool) -> str:
    """SGLang's page (``--enable-metrics``)."""
    del legacy
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    labels = f'{{model_name="{escaped}"}}'
    rate = metrics.prefix_hits / metrics.prefix_queries if metrics.prefix_queries else 0.0
    samples = [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", gauges.running),
        (
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue.",
            gauges.waiting,
        ),
        ("sglang:token_usage", "gauge", "The token usage.", gauges.kv_usage),
        ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", rate),
        (
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            metrics.prompt_tokens,
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            metrics.generation_tokens,
        ),
        (
            "sglang:cached_tokens_total",
            "counter",
            "Number of cached prompt tokens.",
            metrics.prefix_hits,
        ),
    ]
    out: list[str] = []
    for name, kind, text, value in samples:
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{labels} {float(value)}"]
    return "\n".join(out) + "\n"


def render_llamacpp(metrics: EngineMetrics, gauges: Gauges, model: str, *, legacy: bool) -> str:
    """llama-server's page (``--metrics``): no labels."""
    del model, legacy
    return _page(
        [
            (
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                metrics.prompt_tokens,
            ),
            (
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                metrics.generation_tokens,
            ),
            (
                "llamacpp:kv_cache_usage_ratio",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                gauges.kv_usage,
            ),
            (
                "llamacpp:requests_processing",
                "gauge",
                "Number of requests processing.",
                gauges.running,
            ),
            ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", gauges.waiting),
        ]
    )


def render_tgi(metrics: EngineMetrics, gauges: Gauges, model: str, *, legacy: bool) -> str:
    """TGI's page: the batch and the queue, no labels."""
    del model, legacy
    finished = sum(metrics.finished.values())
    return _page(
        [
            ("tgi_batch_current_size", "gauge", "Current batch size", gauges.running),
            ("tgi_queue_size", "gauge", "Current queue size", gauges.waiting),
            ("tgi_request_count", "counter", "Total number of requests", finished),
            (
                "tgi_request_success",
                "counter",
                "Number of successful requests",
                metrics.finished.get("stop", 0) + metrics.finished.get("length", 0),
            ),
        ]
    )


RENDERERS: dict[str, Renderer] = {
    "vllm": render,
    "sglang": render_sglang,
    "llamacpp": render_llamacpp,
    "tgi": render_tgi,
}
