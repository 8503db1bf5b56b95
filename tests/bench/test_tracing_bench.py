"""bench/tracing runs the gateway's real tracing: the span counts it reports are the tree's."""

from __future__ import annotations

from pathlib import Path

from bench.tracing.run import dropping_tracing, main, measure
from gateway.pipeline.context import RequestContext


def test_stage_spans_setting_changes_the_spans_per_traced_request() -> None:
    """Seven spans with stage spans (server, four stages, route, client), two without."""
    _, with_stages = measure(stage_spans=True, requests=50)
    _, default = measure(stage_spans=False, requests=50)
    assert with_stages == 7
    assert default == 2


def test_the_report_names_both_settings_and_the_command(tmp_path: Path) -> None:
    """A tiny run writes the table and the ratio."""
    out = tmp_path / "tracing.md"
    main(["--requests", "50", "--rounds", "1", "--out", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "| true | 7 |" in text
    assert "| false (default) | 2 |" in text
    assert ".venv/bin/python bench/tracing/run.py --requests 50" in text
    assert "x** the CPU per traced request" in text
    assert "| decided by the gateway before the SDK" in text
    assert "x** the CPU per dropped trace" in text


def test_both_dropping_providers_drop_and_only_the_sdk_builds_a_span() -> None:
    """The dropped-trace comparison measures what it says: ratio 0 on both sides, the
    gateway's provider answering with ids only and the SDK's with a non-recording span."""
    for shortcut, kind in ((True, "UnsampledTrace"), (False, "RequestTrace")):
        tracing = dropping_tracing(shortcut)
        ctx = RequestContext("req", route="/v1/chat/completions")
        trace = tracing.start(ctx, None, None)
        assert type(trace).__name__ == kind
        assert not getattr(trace, "recording", False)
