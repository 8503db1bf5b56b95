"""What each kind of inference server looks like to a gateway: pure data, plus detection.

Every server here speaks the OpenAI API, but they differ where a gateway touches them: the
health route and how long it takes, the names of the Prometheus samples for load and the KV
and prefix caches, whether a stream carries ``usage`` when asked, which request ids they
accept and how their error bodies look. :data:`KINDS` holds one :class:`BackendKind` per
server; :func:`classify` names the kind from what a few ``GET`` probes answered (the gateway
sends them; see ``gateway.upstream.backends``).

Sources: each project's public documentation and server source (vLLM, SGLang, llama.cpp's
``llama-server`` and llama-cpp-python's server, Ollama, Hugging Face TGI, TensorRT-LLM's
``trtllm-serve``). docs/backends.md explains each kind for operators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

KindName = Literal["vllm", "sglang", "llamacpp", "ollama", "tgi", "trtllm", "litellm", "openai"]
KIND_NAMES: tuple[str, ...] = (
    "vllm",
    "sglang",
    "llamacpp",
    "ollama",
    "tgi",
    "trtllm",
    "litellm",
    "openai",
)

# The route every OpenAI-compatible server has: the fallback probe when no health route exists.
MODELS_PATH = "/v1/models"
# FastAPI's schema: its title names llama-cpp-python's server, which answers it at once.
OPENAPI_PATH = "/openapi.json"
# What ``auto`` asks each replica first, at start-up and again after it was unreachable:
# routes that answer at once on every kind. The model list is asked only when these did not
# name the kind, because on llama-cpp-python's server it waits behind a running generation,
# and a request waiting there makes that server cut the running stream short (its
# ``--interrupt_requests``, on by default).
DETECTION_PATHS: tuple[str, ...] = (
    "/health",
    "/metrics",
    "/api/version",
    "/info",
    "/get_model_info",
    OPENAPI_PATH,
)

# Prometheus sample name -> (field, preference); a lower preference wins when both appear.
MetricTable = Mapping[str, tuple[str, int]]

_VLLM_METRICS: MetricTable = {
    "vllm:num_requests_running": ("running", 0),
    "vllm:num_requests_waiting": ("waiting", 0),
    "vllm:kv_cache_usage_perc": ("kv_usage", 0),
    "vllm:gpu_cache_usage_perc": ("kv_usage", 1),
    "vllm:prefix_cache_queries_total": ("prefix_queries", 0),
    "vllm:prefix_cache_queries": ("prefix_queries", 0),
    "vllm:prefix_cache_hits_total": ("prefix_hits", 0),
    "vllm:prefix_cache_hits": ("prefix_hits", 0),
    "vllm:gpu_prefix_cache_queries_total": ("prefix_queries", 1),
    "vllm:gpu_prefix_cache_queries": ("prefix_queries", 1),
    "vllm:gpu_prefix_cache_hits_total": ("prefix_hits", 1),
    "vllm:gpu_prefix_cache_hits": ("prefix_hits", 1),
}

# SGLang (``--enable-metrics``): token_usage is the KV pool's used share; cache_hit_rate a
# gauge; newer releases add counters of prompt and cached tokens, preferred when present.
_SGLANG_METRICS: MetricTable = {
    "sglang:num_running_reqs": ("running", 0),
    "sglang:num_queue_reqs": ("waiting", 0),
    "sglang:token_usage": ("kv_usage", 0),
    "sglang:prompt_tokens_total": ("prefix_queries", 0),
    "sglang:cached_tokens_total": ("prefix_hits", 0),
    "sglang:cache_hit_rate": ("prefix_hit_rate", 0),
}

# llama.cpp's llama-server (``--metrics``): slots busy, requests deferred for lack of a slot.
_LLAMACPP_METRICS: MetricTable = {
    "llamacpp:requests_processing": ("running", 0),
    "llamacpp:requests_deferred": ("waiting", 0),
    "llamacpp:kv_cache_usage_ratio": ("kv_usage", 0),
}

# TGI: the running batch and the queue; no KV-cache share and no prefix-cache counters.
_TGI_METRICS: MetricTable = {
    "tgi_batch_current_size": ("running", 0),
    "tgi_queue_size": ("waiting", 0),
}


@dataclass(frozen=True, slots=True)
class BackendKind:
    """How the gateway treats one kind of server."""

    name: str
    # Health routes in order of preference; the first one the server has is probed.
    health_paths: tuple[str, ...]
    # The least patience a health probe gets (the gateway's own timeout may be longer).
    probe_timeout_s: float
    metrics_path: str | None
    metrics: MetricTable = field(default_factory=dict)
    # Honours ``stream_options.include_usage``; when False the gateway counts the tokens.
    stream_usage: bool = True
    # Refuses an ``x-request-id`` that is not a UUID (the gateway always sends UUIDs).
    uuid_request_ids: bool = False
    # How its error bodies look: docs/backends.md shows each.
    error_shape: str = "openai"
    description: str = ""
    # Some servers of the kind run one generation at a time, and a request on any other route
    # than ``health_paths`` waits behind it (llama-cpp-python): while the gateway has requests
    # in flight there, such a probe is not sent, since it would only queue (and may make the
    # server end the running stream early); the traffic itself shows the server alive.
    serial: bool = False

    @property
    def metric_prefix(self) -> str:
        """The start every one of its sample names shares (a fast line filter)."""
        names = list(self.metrics)
        if not names:
            return ""
        first = names[0]
        cut = first.find(":") + 1 or first.find("_") + 1
        return first[:cut]

    @property
    def probe_candidates(self) -> tuple[str, ...]:
        """Its health routes, then ``/v1/models`` (every OpenAI-compatible server has it)."""
        return (*self.health_paths, MODELS_PATH)


KINDS: dict[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind(
            "vllm", ("/health",), 0.0, "/metrics", _VLLM_METRICS, description="vLLM's OpenAI server"
        ),
        # /health waits for a one-token generation (about 1 s at least, by default).
        BackendKind(
            "sglang",
            ("/health",),
            3.0,
            "/metrics",
            _SGLANG_METRICS,
            error_shape="openai_flat",
            description="SGLang",
        ),
        # llama-server has /health; llama-cpp-python's server has none, and its /v1/models
        # waits behind a running generation, while /docs answers at once. CPU servers are slow.
        BackendKind(
            "llamacpp",
            ("/health", "/docs"),
            2.0,
            "/metrics",
            _LLAMACPP_METRICS,
            stream_usage=False,
            uuid_request_ids=True,
            error_shape="llamacpp",
            description="llama.cpp (llama-server or llama-cpp-python)",
            serial=True,
        ),
        BackendKind(
            "ollama",
            ("/api/version",),
            1.0,
            None,
            error_shape="openai",
            description="Ollama's OpenAI-compatible API",
        ),
        BackendKind(
            "tgi",
            ("/health",),
            1.0,
            "/metrics",
            _TGI_METRICS,
            error_shape="tgi",
            description="Hugging Face TGI",
        ),
        # /metrics is JSON iteration statistics, not Prometheus text: not parsed.
        BackendKind("trtllm", ("/health",), 1.0, None, description="TensorRT-LLM trtllm-serve"),
        # A LiteLLM proxy: its /health (with the key) runs a completion on every deployment,
        # so the probe is its readiness route, which asks no model; no engine metrics.
        BackendKind("litellm", ("/health/readiness",), 1.0, None, description="a LiteLLM proxy"),
        BackendKind("openai", ("/health",), 1.0, None, description="any OpenAI-compatible server"),
    )
}


@dataclass(frozen=True, slots=True)
class Probe:
    """One detection ``GET``: its status (``None``: no answer) and the start of its body."""

    status: int | None
    body: bytes = b""

    @property
    def ok(self) -> bool:
        """Answered 200."""
        return self.status == 200

    @property
    def exists(self) -> bool:
        """The route exists: any answer but 404/405/501 (a 503 is a route saying 'not yet')."""
        return self.status is not None and self.status not in (404, 405, 501)

    def json(self) -> Any:
        """The body as JSON, or ``None`` (also when nested too deep to parse: a failed probe)."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None


@dataclass(frozen=True, slots=True)
class Detection:
    """What ``auto`` concluded about one replica, and from what."""

    kind: str
    evidence: str


def _printable(text: str, limit: int = 32) -> str:
    """A server-chosen string made safe for a log line and the admin view."""
    return "".join(c for c in text[:limit] if c.isprintable()) or "?"


def _metrics_kind(probe: Probe) -> Detection | None:
    if not probe.ok:
        return None
    text = probe.body.decode("utf-8", "replace")
    for prefix, kind in (
        ("vllm:", "vllm"),
        ("sglang:", "sglang"),
        ("llamacpp:", "llamacpp"),
        ("tgi_", "tgi"),
        ("trtllm_", "trtllm"),
    ):
        if any(line.startswith(prefix) for line in text.splitlines()):
            return Detection(kind, f"/metrics has {prefix}* samples")
    return None


_TITLE = re.compile(rb'"title"\s*:\s*"([^"]{0,120})"')


def _openapi_kind(probe: Probe) -> Detection | None:
    """llama-cpp-python's server and LiteLLM's proxy name themselves in their OpenAPI
    schema's title."""
    if not probe.ok:
        return None
    title = _TITLE.search(probe.body[:8192])
    if title is not None and b"llama.cpp" in title.group(1):
        return Detection("llamacpp", "/openapi.json titled llama.cpp")
    if title is not None and title.group(1).startswith(b"LiteLLM"):
        return Detection("litellm", "/openapi.json titled LiteLLM")
    return None


def _litellm_health(probe: Probe) -> Detection | None:
    """A LiteLLM proxy's ``/health`` (answered with its key) lists its deployments."""
    data = probe.json() if probe.ok else None
    if isinstance(data, dict) and "healthy_endpoints" in data and "unhealthy_endpoints" in data:
        return Detection("litellm", "/health lists healthy_endpoints (LiteLLM)")
    return None


def _info_kind(probes: Mapping[str, Probe]) -> Detection | None:
    info = probes.get("/info", Probe(None)).json() if probes.get("/info", Probe(None)).ok else None
    if isinstance(info, dict) and "model_id" in info:
        return Detection("tgi", "/info describes a TGI router (model_id)")
    sglang = probes.get("/get_model_info", Probe(None))
    model_info = sglang.json() if sglang.ok else None
    if isinstance(model_info, dict) and "model_path" in model_info:
        return Detection("sglang", "/get_model_info answered (model_path)")
    version = probes.get("/api/version", Probe(None))
    data = version.json() if version.ok else None
    if isinstance(data, dict) and isinstance(data.get("version"), str):
        return Detection("ollama", f"/api/version answered {_printable(data['version'])}")
    return None


_OWNERS = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "me": "llamacpp",
    "library": "ollama",
    "ollama": "ollama",
    "tensorrt_llm": "trtllm",
    "tgi": "tgi",
    "text-generation-inference": "tgi",
}


def _models_kind(probe: Probe) -> Detection | None:
    data = probe.json() if probe.ok else None
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict):
        return None if not probe.ok else Detection("openai", "/v1/models answered")
    owner = cards[0].get("owned_by")
    kind = _OWNERS.get(owner) if isinstance(owner, str) else None
    if kind is None:
        return Detection("openai", "/v1/models answered")
    return Detection(kind, f"/v1/models owned_by {owner!r}")


def classify(probes: Mapping[str, Probe]) -> Detection | None:
    """The kind of server that answered ``probes`` (path -> answer); ``None``: unreachable.

    Strongest evidence first: a server's own metric names, then its own routes, then the
    model list's ``owned_by``; a server that only lists models is plain ``openai``.
    """
    if not any(p.status is not None for p in probes.values()):
        return None
    found = identify(probes)
    if found is None:
        found = _models_kind(probes.get(MODELS_PATH, Probe(None)))
    return found or Detection("openai", "answers HTTP but lists no models")


def identify(probes: Mapping[str, Probe]) -> Detection | None:
    """The kind named by the routes that answer at once (``DETECTION_PATHS``), if any."""
    metrics = probes.get("/metrics", Probe(None))
    found = (
        _metrics_kind(metrics)
        or _info_kind(probes)
        or _openapi_kind(probes.get(OPENAPI_PATH, Probe(None)))
        or _litellm_health(probes.get("/health", Probe(None)))
    )
    if found is None and metrics.ok and metrics.body.lstrip()[:1] == b"[":
        found = Detection("trtllm", "/metrics answered JSON iteration statistics")
    return found


def probe_path(kind: BackendKind, probes: Mapping[str, Probe]) -> str | None:
    """The route to probe: the first of ``kind.probe_candidates`` that exists.

    A server without any health route is alive when it lists its models, so ``/v1/models``
    ends the list. ``None`` when the server answered none of them (unreachable: ask again).
    A candidate missing from ``probes`` counts as not asked (no answer).
    """
    answered = False
    for path in kind.probe_candidates:
        probe = probes.get(path, Probe(None))
        answered = answered or probe.status is not None
        if probe.exists:
            return path
    return MODELS_PATH if answered else None
