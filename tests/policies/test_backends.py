"""Backend kinds: the table, detection from probe answers, and the probe route's choice."""

from __future__ import annotations

import json

import pytest

from policies.backends import KIND_NAMES, KINDS, MODELS_PATH, Probe, classify, probe_path


def _models(owner: str) -> Probe:
    return Probe(
        200, json.dumps({"object": "list", "data": [{"id": "m", "owned_by": owner}]}).encode()
    )


def test_every_kind_is_described() -> None:
    """Each kind the settings accept has a row, and every row ends with /v1/models."""
    assert set(KINDS) == set(KIND_NAMES)
    for kind in KINDS.values():
        assert kind.probe_candidates[-1] == MODELS_PATH
        assert kind.health_paths


def test_sglang_probe_allows_for_its_slow_health() -> None:
    """SGLang's /health takes >= 1 s, so its probe waits longer than that."""
    assert KINDS["sglang"].probe_timeout_s > 1.0


@pytest.mark.parametrize(
    ("probes", "kind"),
    [
        ({"/metrics": Probe(200, b'vllm:num_requests_running{a="b"} 1\n')}, "vllm"),
        ({"/metrics": Probe(200, b"# HELP x\nsglang:token_usage 0.1\n")}, "sglang"),
        ({"/metrics": Probe(200, b"llamacpp:requests_processing 0\n")}, "llamacpp"),
        ({"/metrics": Probe(200, b"tgi_queue_size 0\n")}, "tgi"),
        ({"/info": Probe(200, b'{"model_id": "m"}'), "/metrics": Probe(404)}, "tgi"),
        ({"/get_model_info": Probe(200, b'{"model_path": "m"}')}, "sglang"),
        ({"/api/version": Probe(200, b'{"version": "0.12.6"}')}, "ollama"),
        ({MODELS_PATH: _models("vllm"), "/metrics": Probe(404)}, "vllm"),
        ({MODELS_PATH: _models("me"), "/health": Probe(404)}, "llamacpp"),
        ({MODELS_PATH: _models("tensorrt_llm")}, "trtllm"),
        ({MODELS_PATH: _models("someone"), "/health": Probe(404)}, "openai"),
        ({"/metrics": Probe(200, b'[{"iter": 1}]'), MODELS_PATH: Probe(200, b"{}")}, "trtllm"),
        ({"/health": Probe(200)}, "openai"),
        (
            {"/openapi.json": Probe(200, b'{"openapi":"3.1.0","info":{"title":"LiteLLM API"}}')},
            "litellm",
        ),
        (
            {"/health": Probe(200, b'{"healthy_endpoints":[],"unhealthy_endpoints":[]}')},
            "litellm",
        ),
    ],
)
def test_classify(probes: dict[str, Probe], kind: str) -> None:
    """The strongest evidence names the kind; a bare OpenAI server is 'openai'."""
    found = classify(probes)
    assert found is not None
    assert found.kind == kind
    assert found.evidence


def test_nothing_answered_is_no_detection() -> None:
    """An unreachable replica is not classified (detection is tried again later)."""
    assert classify({"/health": Probe(None), MODELS_PATH: Probe(None)}) is None


def test_metric_names_beat_routes() -> None:
    """A vLLM page wins over an owned_by that says otherwise."""
    probes = {"/metrics": Probe(200, b"vllm:num_requests_waiting 0\n"), MODELS_PATH: _models("me")}
    found = classify(probes)
    assert found is not None
    assert found.kind == "vllm"


def test_probe_path_prefers_an_existing_health_route() -> None:
    """The first health route that exists is probed, even when it says 503 (loading)."""
    kind = KINDS["llamacpp"]
    assert (
        probe_path(kind, {"/health": Probe(503), "/docs": Probe(200), MODELS_PATH: Probe(200)})
        == "/health"
    )
    assert (
        probe_path(kind, {"/health": Probe(404), "/docs": Probe(200), MODELS_PATH: Probe(200)})
        == "/docs"
    )


def test_probe_path_falls_back_to_the_model_list() -> None:
    """A server without any health route is probed on /v1/models, never declared dead."""
    kind = KINDS["vllm"]
    assert probe_path(kind, {"/health": Probe(404), MODELS_PATH: Probe(200)}) == MODELS_PATH
    assert probe_path(kind, {"/health": Probe(None), MODELS_PATH: Probe(None)}) is None


def test_metric_prefixes() -> None:
    """Each kind's sample filter is its servers' own prefix; kinds without metrics have none."""
    assert {name: k.metric_prefix for name, k in KINDS.items()} == {
        "vllm": "vllm:",
        "sglang": "sglang:",
        "llamacpp": "llamacpp:",
        "tgi": "tgi_",
        "ollama": "",
        "trtllm": "",
        "litellm": "",
        "openai": "",
    }


def test_server_strings_are_tamed_in_the_evidence() -> None:
    """A version string with control characters or great length is cut and cleaned."""
    hostile = json.dumps({"version": "1.0\n\x1b[31mFAKE LOG LINE" + "x" * 500}).encode()
    found = classify({"/api/version": Probe(200, hostile)})
    assert found is not None
    assert found.kind == "ollama"
    assert "\n" not in found.evidence
    assert "\x1b" not in found.evidence
    assert len(found.evidence) < 80


def test_json_nested_too_deep_is_no_evidence() -> None:
    """A model list nested thousands deep reads as no JSON (not a RecursionError)."""
    deep = Probe(200, b'{"data":' + b"[" * 3000 + b"]" * 3000 + b"}")
    assert deep.json() is None
    found = classify({MODELS_PATH: deep})
    assert found is not None
    assert found.kind == "openai"


def test_the_kinds_table_of_docs_backends_md() -> None:
    """docs/backends.md, "The kinds": each row's health routes, load metrics read, stream
    ``usage``, request-id rule and error shape, as the gateway holds them."""
    rows = {
        # kind: (health routes, metric names read, stream usage, UUID-only ids, error shape)
        "vllm": (("/health",), "vllm:", True, False, "openai"),
        "sglang": (("/health",), "sglang:", True, False, "openai_flat"),
        "llamacpp": (("/health", "/docs"), "llamacpp:", False, True, "llamacpp"),
        "ollama": (("/api/version",), None, True, False, "openai"),
        "tgi": (("/health",), "tgi_", True, False, "tgi"),
        "trtllm": (("/health",), None, True, False, "openai"),
        "litellm": (("/health/readiness",), None, True, False, "openai"),
        "openai": (("/health",), None, True, False, "openai"),
    }
    assert set(rows) == set(KINDS)
    for name, (health, prefix, usage, uuid_ids, shape) in rows.items():
        kind = KINDS[name]
        assert kind.probe_candidates == (*health, MODELS_PATH), name
        assert (kind.stream_usage, kind.uuid_request_ids, kind.error_shape) == (
            usage,
            uuid_ids,
            shape,
        ), name
        if prefix is None:
            assert not kind.metrics, name
        else:
            assert kind.metrics, name
            assert all(m.startswith(prefix) for m in kind.metrics), name
    assert set(KINDS["vllm"].metrics) >= {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
    }
    assert set(KINDS["sglang"].metrics) == {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:cache_hit_rate",
    }
    assert set(KINDS["llamacpp"].metrics) == {
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:kv_cache_usage_ratio",
    }
    assert {k: v[0] for k, v in KINDS["tgi"].metrics.items()} == {
        "tgi_batch_current_size": "running",
        "tgi_queue_size": "waiting",
    }
