"""docs/observability.md's claims, checked against the code: the metric table (names, labels and
label values), the access line's fields, the log queue's bound, the quiet client loggers and the
tracing defaults."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.config.settings import TelemetrySettings
from gateway.limits import precise_cap
from gateway.limits.usage import MemoryUsageStore, UsageCollector, UsageLedger
from gateway.pipeline.context import Failure, Usage
from gateway.pipeline.events import Outcome
from gateway.telemetry import semconv as sc
from gateway.telemetry.logging import LogSink, configure_logging
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.observer import access_fields
from gateway.telemetry.refusals import REASONS, ROUTE_CLASSES, AuthRefusals
from gateway.upstream.fair_queue import PRIORITIES, Ticket
from gateway.upstream.replicas import ReplicaPool
from policies.cost import CostModel, TierPrice
from policies.errors import RateLimited
from policies.ratelimit import Limit
from tests.gateway.telemetry.factories import finished_context

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs/observability.md").read_text(encoding="utf-8")
_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _without_parentheses(text: str) -> str:
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def _doc_table() -> dict[str, set[str]]:
    """Each metric of the doc's table and the label names it gives."""
    table: dict[str, set[str]] = {}
    for line in DOC.splitlines():
        if not line.startswith("| `tiergate_"):
            continue
        names_cell, labels_cell = line.strip("|").split("|")
        names = re.findall(r"`(tiergate_\w+)`", names_cell)
        first, _, extra = _without_parentheses(labels_cell).partition("; shed also")
        labels = {part.split("=")[0].strip() for part in first.split(",")} - {"—", ""}
        for name in names:
            table[name] = set(labels)
        if extra:  # "tier, priority; shed also reason": the shed counter has one more
            table[sc.M_QUEUE_SHED + "_total"] = labels | {extra.strip()}
    return table


_COSTS = CostModel({"fast": TierPrice(0.25, 0.25), "precise": TierPrice(1.0, 1.0)}, "precise")


def _doc_values(pattern: str) -> set[str]:
    """The ``a / b / c`` values the doc lists after ``pattern``."""
    found = re.search(pattern + r"([a-z_]+(?: / [a-z_]+)+)", _flat(DOC))
    assert found is not None, pattern
    return set(found.group(1).split(" / "))


def _exercised_metrics() -> GatewayMetrics:
    """Metrics with at least one sample in every family of the table."""
    pool = ReplicaPool("fast", ["http://10.0.0.1:8000"], 8, 1.0)
    (replica,) = pool.replicas
    pool.record_success(replica)
    pool.count_retry("connect")
    pool.queue_stats.waited(Ticket("acme"), 0.01)
    pool.queue_stats.refused(Ticket("acme"), "full")
    metrics = GatewayMetrics(CollectorRegistry(), {"fast": pool}, precise_tier="p", target_share=0)
    stream = finished_context(stream=True, usage=Usage(10, 11, 4), first_chunk_s=0.2)
    metrics.record(stream, "complete", 1.2, 0.0003)
    metrics.record(finished_context(stream=True, first_chunk_s=0.1), "upstream_stall", 2.0, 0.0)
    refused = finished_context(status=429)
    refused.admitted = False
    refused.failure = Failure.of(RateLimited("over"))
    metrics.record(refused, "RateLimited", 0.001, 0.001)
    AuthRefusals(metrics.auth_refusals).refused("/admin/keys", "invalid_admin_token", None)
    return metrics


def test_the_metric_table_names_each_family_with_its_labels() -> None:
    """Every metric in the table is exposed under that name with exactly those labels."""
    exposed: dict[str, set[str]] = {}
    ledger = UsageLedger(_COSTS, MemoryUsageStore())  # the cost and shadow families
    ledger.record(finished_context(stream=False, usage=Usage(10, 11, 4)))
    ledger.record_shadow("precise", "answer", Usage(prompt_tokens=4, completion_tokens=2))
    families = [*_exercised_metrics().registry.collect(), *UsageCollector(ledger).collect()]
    for family in families:
        for sample in family.samples:
            name = sample.name
            for suffix in _SUFFIXES:
                if name.endswith(suffix) and not name.endswith("_total"):
                    name = name.removesuffix(suffix)
            exposed.setdefault(name, set()).update(set(sample.labels) - {"le"})
    table = _doc_table()
    assert len(table) == 24
    assert "`tiergate_precise_share` (last 1,000 routed requests)" in DOC
    assert (
        GatewayMetrics(CollectorRegistry(), {}, precise_tier="p", target_share=0).share.size == 1000
    )
    for name, labels in table.items():
        assert name in exposed, name
        assert exposed[name] == labels, name


def test_the_label_values_the_table_lists_are_all_there_are() -> None:
    """The values listed for limit, cause, shed reason, priority and direction are the code's."""
    limits = {"all", "budget_daily", "budget_monthly", precise_cap.LIMIT} | {x.value for x in Limit}
    assert _doc_values(r"limit \(") == limits
    assert _doc_values(r"outcome \(") == {sc.RATELIMIT_ALLOWED, sc.RATELIMIT_REJECTED}
    assert _doc_values(r"cause = ") == {o.value for o in Outcome} - {Outcome.COMPLETE.value}
    source = (REPO / "gateway/upstream/replicas.py").read_text(encoding="utf-8")
    shed_reasons = set(re.findall(r'self\.overloaded\(ticket, "(\w+)"\)', source))
    assert _doc_values(r"shed also reason \(") == shed_reasons == {"full", "deadline", "down"}
    assert _doc_values(r"priority \(") == set(PRIORITIES)
    tokens = {sc.TOKENS_INPUT, sc.TOKENS_OUTPUT, sc.TOKENS_CACHED_INPUT}
    assert _doc_values(r"direction = ") == tokens
    assert _doc_values(r"\| route \(") == set(ROUTE_CLASSES)
    assert _doc_values(r", reason \(") == set(REASONS)


def test_the_access_line_has_every_field_the_doc_names() -> None:
    """request_id ... ttft_ms and the token counts are keys of the access line."""
    logs = DOC.split("## Logs", 1)[1].split("token counts", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", logs)) - {"request.finished"}
    fields = access_fields(finished_context(), "complete", 0.1, 0.001)
    assert named <= set(fields)
    assert len(named) == 19
    assert {"prompt_tokens", "completion_tokens", "cached_tokens"} <= set(fields)
    assert "20,000 lines" in _flat(DOC)
    sink = LogSink(io.StringIO())
    assert sink.max_lines == 20_000
    sink.close()


@pytest.mark.usefixtures("restore_logging")
def test_client_and_uvicorn_access_loggers_are_held_at_warning() -> None:
    """Even at log_level debug, aiohttp, httpx and uvicorn.access log WARNING and above only."""
    sink = configure_logging(TelemetrySettings(log_level="debug"), stream=io.StringIO())
    try:
        for name in ("aiohttp", "httpx", "uvicorn.access"):
            assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name
    finally:
        sink.close()


def test_tracing_defaults_are_as_documented() -> None:
    """Tracing off, every request sampled once on, no stage spans, no content."""
    telemetry = TelemetrySettings()
    assert not telemetry.tracing
    assert telemetry.trace_sample_ratio == 1.0
    assert not telemetry.stage_spans
    assert not telemetry.capture_content
    assert "default `1.0`" in DOC
