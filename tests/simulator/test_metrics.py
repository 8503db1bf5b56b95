"""``/metrics``: vLLM's exact names, labels and a valid Prometheus text format."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from simulator.metrics import EngineMetrics, Gauges, Histogram, render
from tests.simulator.procs import SimulatorFactory, SimulatorProcess

NAMES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
}


def test_histogram_buckets_are_cumulative() -> None:
    """Rendered buckets are cumulative and end with +Inf equal to the count."""
    histogram = Histogram((0.1, 1.0))
    histogram.observe(0.05)
    histogram.observe(0.5, times=2)
    histogram.observe(5.0)
    out: list[str] = []
    histogram.render("h", 'a="b"', out)
    assert out == [
        'h_bucket{a="b",le="0.1"} 1.0',
        'h_bucket{a="b",le="1.0"} 3.0',
        'h_bucket{a="b",le="+Inf"} 4.0',
        'h_sum{a="b"} 6.05',
        'h_count{a="b"} 4.0',
    ]


def test_render_parses_and_escapes_model_names() -> None:
    """The page parses as Prometheus text even with quotes in the model name."""
    page = render(EngineMetrics(), Gauges(1, 2, 0.5, 16, 100), 'a "quoted" model', legacy=True)
    families = {f.name: f for f in text_string_to_metric_families(page)}
    running = families["vllm:num_requests_running"].samples[0]
    assert running.labels == {"engine": "0", "model_name": 'a "quoted" model'}
    assert running.value == 1
    assert families["vllm:gpu_cache_usage_perc"].samples[0].value == 0.5


async def test_metrics_endpoint_names(sim: SimulatorProcess) -> None:
    """A live replica exposes every vLLM metric the gateway reads, with label model_name."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}
        ) as response:
            assert response.status == 200
        async with session.get(sim.url + "/metrics") as response:
            page = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(page)}
    assert {name: families[name].type for name in NAMES} == NAMES
    assert "vllm:gpu_cache_usage_perc" not in families
    success = {
        s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples
    }
    assert success["stop"] + success["length"] == 1
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16"
    assert info["num_gpu_blocks"] == "2048"
    assert families["vllm:prompt_tokens"].samples[0].labels["model_name"] == "tiergate-fast"


async def test_legacy_metrics_flag(start_simulator: SimulatorFactory) -> None:
    """``--legacy-metrics`` adds the deprecated ``vllm:gpu_cache_usage_perc`` gauge."""
    sim = start_simulator("--legacy-metrics", "--latency-scale", "0", "--kv-blocks", "512")
    page = sim.metrics_text()
    assert 'vllm:gpu_cache_usage_perc{engine="0",model_name="tiergate-fast"} 0.0' in page
    assert 'num_gpu_blocks="512"' in page
