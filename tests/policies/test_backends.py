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
