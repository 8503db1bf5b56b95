"""bench/bookkeeping measures the gateway's own code against the way it was done before."""

from __future__ import annotations

import io
import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from bench.bookkeeping.run import _context, _PrometheusChildren, main
from gateway.config.settings import TelemetrySettings
from gateway.telemetry import metrics as gm
from gateway.telemetry.logging import access_logger, configure_logging
from gateway.telemetry.observer import access_fields


def test_the_report_has_every_piece_and_the_command(tmp_path: Path) -> None:
    """A short run writes the table: three pieces and their total, with the command."""
    out = tmp_path / "bookkeeping.md"
    assert main(["--requests", "50", "--rounds", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert ".venv/bin/python bench/bookkeeping/run.py --requests 50" in text
    for piece in ("access line", "metrics", "upstream deadline", "**all three**"):
        assert f"| {piece} |" in text


def test_the_baseline_metrics_make_the_same_updates_as_the_gateway() -> None:
    """The prometheus_client baseline counts what ``GatewayMetrics.record`` counts (same
    series, same values), so the comparison is like for like."""
    ctx = _context()
    old = _PrometheusChildren()
    registry = CollectorRegistry()
    new = gm.GatewayMetrics(registry, {}, precise_tier="precise", target_share=0.3)
    old.record(ctx, 0.0012, 0.0003)
    new.record(ctx, "complete", 0.0012, 0.0003)
    assert old.requests.labels(ctx.route, "fast", "2xx")._value.get() == 1.0
    exposed = generate_latest(registry).decode()
    assert (
        'tiergate_requests_total{route="/v1/chat/completions",status_class="2xx",tier="fast"} 1.0'
        in exposed
    )
    assert 'tiergate_tokens_total{direction="input",tier="fast"} 12.0' in exposed
    assert old.tokens.labels("fast", "input")._value.get() == 12.0


def test_the_direct_access_line_is_what_the_benchmark_times() -> None:
    """The 'after' writer is the observer's (a JSON line with the access fields)."""
    stream = io.StringIO()
    sink = configure_logging(TelemetrySettings(log_format="json"), stream=stream)
    try:
        access_logger().info("request.finished", **access_fields(_context(), "complete", 0.1, 0.01))
    finally:
        sink.close()
    line = json.loads(stream.getvalue())
    assert line["event"] == "request.finished"
    assert line["status"] == 200
