"""CPU per traced request, with stage spans and without (the default): the gateway's own tracing.

Usage: ``.venv/bin/python bench/tracing/run.py [--requests 3000] [--rounds 3]
[--out bench/results/tracing.md]``

Each request runs what the gateway does for a sampled, non-streaming chat completion: the
server span opened by ``Tracing.start`` with a caller's ``traceparent``, the four stage marks,
one upstream attempt (``attempt_started`` / ``attempt_ended`` with a real answer body), and
``finish``. Ended spans go to an exporter that encodes them in batches of 512 (the
``BatchSpanProcessor`` default) with the OTLP protobuf encoder the gateway's OTLP exporter uses
(``encode_spans``), and drops the bytes: creation, attributes, ending and encoding are
measured, the HTTP POST to a collector is not. The two settings alternate round by round;
the figure is CPU time (``time.process_time``) per request, median of the rounds, and the
ratio is taken within a run.

A second table prices a new trace the sampler drops (no incoming ``traceparent``, ratio 0):
the same request with the gateway's provider, which decides before the SDK and keeps only the
ids (``UnsampledTrace``), against a provider with the SDK's own sampler and ids, which builds a
non-recording span for it. The two alternate round by round as well.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import (  # noqa: E402  # after the path fix
    encode_spans,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402  # same
from opentelemetry.sdk.trace.export import (  # noqa: E402  # same
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased  # noqa: E402  # same

from bench.harness.markdown import report_head  # noqa: E402  # same
from gateway.config.settings import TelemetrySettings  # noqa: E402  # same
from gateway.pipeline.context import RequestContext  # noqa: E402  # same
from gateway.pipeline.events import AttemptEnd, AttemptStart  # noqa: E402  # same
from gateway.telemetry.tracing import Tracing, build_tracer_provider  # noqa: E402  # same
from policies.requests import RequestSummary  # noqa: E402  # same
from policies.tiering import RouteDecision  # noqa: E402  # same

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BODY = {
    "model": "tiergate-fast",
    "messages": [{"role": "user", "content": "Name a colour."}],
    "max_tokens": 16,
    "temperature": 0.2,
}
ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "model": "tiergate-fast",
        "usage": {"prompt_tokens": 9, "completion_tokens": 2},
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Red"},
            }
        ],
    }
).encode()


BATCH = 512  # the BatchSpanProcessor's default export batch


class EncodingExporter(SpanExporter):
    """Encodes spans in batches of 512 as the OTLP exporter behind the gateway's
    BatchSpanProcessor would, then drops the bytes."""

    def __init__(self) -> None:
        self.spans = 0
        self.pending: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Queue ended spans; encode a full batch to protobuf bytes."""
        self.pending.extend(spans)
        self.spans += len(spans)
        if len(self.pending) >= BATCH:
            self.flush()
        return SpanExportResult.SUCCESS

    def flush(self) -> None:
        """Encode what is queued."""
        if self.pending:
            encode_spans(self.pending).SerializeToString()
            self.pending = []


def tracing_for(stage_spans: bool, exporter: EncodingExporter) -> Tracing:
    """The gateway's tracing, every request sampled, exporting to ``exporter``."""
    settings = TelemetrySettings(tracing=True, otel_env={}, stage_spans=stage_spans)
    provider = build_tracer_provider(settings, exporter)
    assert provider is not None  # tracing is on
    return Tracing(provider, capture_content=False, stage_spans=stage_spans)


def dropping_tracing(shortcut: bool) -> Tracing:
    """Tracing at ratio 0: the gateway's provider (``shortcut``) or one the SDK decides for."""
    if shortcut:
        settings = TelemetrySettings(tracing=True, otel_env={}, trace_sample_ratio=0.0)
        provider = build_tracer_provider(settings, EncodingExporter())
        assert provider is not None  # tracing is on
    else:
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))
        provider.add_span_processor(SimpleSpanProcessor(EncodingExporter()))
    return Tracing(provider, capture_content=False)


def measure_dropped(shortcut: bool, requests: int) -> float:
    """CPU µs per request whose new trace the sampler drops."""
    tracing = dropping_tracing(shortcut)
    for number in range(200):  # warm-up
        one_request(tracing, number, None)
    started = time.process_time()
    for number in range(requests):
        one_request(tracing, number, None)
    spent = time.process_time() - started
    tracing.shutdown()
    return spent / requests * 1e6


def one_request(tracing: Tracing, number: int, traceparent: str | None = PARENT) -> None:
    """One request's tracing, as the request path drives it (sampled under ``PARENT``)."""
    ctx = RequestContext(f"req-{number}", route="/v1/chat/completions")
    ctx.summary = RequestSummary(
        kind="chat",
        model="auto",
        stream=False,
        max_tokens=16,
        include_usage=False,
        prompt_chars=14,
        has_tools=False,
        response_format=None,
    )
    trace = ctx.trace = tracing.start(ctx, traceparent, None)
    for stage in ("auth", "validate", "classify", "ratelimit"):
        trace.mark(stage)
    ctx.decision = RouteDecision("fast", "classifier", 0.12)
    ctx.admitted = True
    start = AttemptStart(
        "fast",
        "10.0.0.7:8000",
        "http://10.0.0.7:8000",
        "prefix_affinity",
        time.perf_counter(),
        2,
        None,
        f"up-{number}",
        BODY,
    )
    ctx.attempts = 1
    ctx.replica = start.replica
    trace.attempt_started(ctx, start)
    trace.attempt_ended(ctx, AttemptEnd(0.001, body=ANSWER))
    ctx.status = 200
    trace.finish(ctx, "complete")


def measure(stage_spans: bool, requests: int) -> tuple[float, float]:
    """CPU µs per traced request and spans per request, for one setting."""
    exporter = EncodingExporter()
    tracing = tracing_for(stage_spans, exporter)
    for number in range(200):  # warm-up
        one_request(tracing, number)
    exporter.flush()
    exporter.spans = 0
    started = time.process_time()
    for number in range(requests):
        one_request(tracing, number)
    exporter.flush()
    spent = time.process_time() - started
    tracing.shutdown()
    return spent / requests * 1e6, exporter.spans / requests


def _row(*cells: str, rounds: list[float], digits: int) -> str:
    """A table row: ``cells``, the median of ``rounds``, then every round."""
    every = ", ".join(f"{v:,.{digits}f}" for v in rounds)
    median = f"{statistics.median(rounds):,.{digits}f}"
    return "| " + " | ".join([*cells, median, every]) + " |"


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/tracing.md")
    args = p.parse_args(argv)
    cpu: dict[bool, list[float]] = {True: [], False: []}
    spans: dict[bool, float] = {}
    for _ in range(args.rounds):
        for stage_spans in (True, False):
            micros, per_request = measure(stage_spans, args.requests)
            cpu[stage_spans].append(micros)
            spans[stage_spans] = per_request
    dropped: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for shortcut in (True, False):
            dropped[shortcut].append(measure_dropped(shortcut, args.requests))
    on, off = statistics.median(cpu[True]), statistics.median(cpu[False])
    fast, sdk = statistics.median(dropped[True]), statistics.median(dropped[False])
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python bench/tracing/run.py", *given])
    lines = [
        *report_head("What a traced request costs: stage spans on and off", command),
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; Python {sys.version.split()[0]}; "
        f"{args.requests:,} sampled non-streaming requests per round, {args.rounds} rounds "
        "alternating the settings;",
        "- measured: span creation, attributes, ending and OTLP protobuf encoding in-process "
        "(the export's HTTP POST is not); CPU time per request, median of the rounds.",
        "",
        "| `telemetry.stage_spans` | spans per request | CPU µs per traced request | rounds |",
        "|---|---:|---:|---|",
        _row("true", f"{spans[True]:.0f}", rounds=cpu[True], digits=0),
        _row("false (default)", f"{spans[False]:.0f}", rounds=cpu[False], digits=0),
        "",
        f"Stage spans on / off: **{on / off:.2f}x** the CPU per traced request. With "
        "`trace_sample_ratio` r, the average request pays r times this, plus (1 - r) times "
        "the cost of a dropped trace below.",
        "",
        "| a new trace the sampler drops (ratio 0, no incoming traceparent) "
        "| CPU µs per request | rounds |",
        "|---|---:|---|",
        _row(
            "decided by the gateway before the SDK (the gateway's provider)",
            rounds=dropped[True],
            digits=1,
        ),
        _row("decided by the SDK (its own sampler and ids)", rounds=dropped[False], digits=1),
        "",
        f"Gateway / SDK: **{fast / sdk:.2f}x** the CPU per dropped trace.",
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
