"""The span exporter's thread runs below the event loop's priority (Linux): BackgroundExporter."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry.tracing import (
    EXPORTER_NICE_STEPS,
    BackgroundExporter,
    lower_thread_priority,
)

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux feature"
)


def _spans(count: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    for number in range(count):
        tracer.start_span(f"span {number}").end()
    return list(memory.get_finished_spans())


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@linux_only
def test_a_background_thread_exports_at_a_lower_priority_and_the_loop_keeps_its_own() -> None:
    inner = InMemorySpanExporter()
    exporter = BackgroundExporter(inner)
    main_before = _nice(threading.get_native_id())
    seen: dict[str, int] = {}

    def worker() -> None:
        tid = threading.get_native_id()
        before = _nice(tid)
        seen["result"] = exporter.export(_spans(3)).value
        seen["lowered_by"] = _nice(tid) - before
        exporter.export(_spans(2))  # the second export does not lower it again
        seen["after_second"] = _nice(tid) - before
        seen["expected"] = min(19, before + EXPORTER_NICE_STEPS) - before
        seen["before"] = before

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["result"] == SpanExportResult.SUCCESS.value
    assert seen["lowered_by"] == seen["expected"]
    assert seen["expected"] > 0 or seen["before"] == 19  # a test run at nice 19 has no room
    assert seen["after_second"] == seen["expected"]
    assert len(inner.get_finished_spans()) == 5  # every span reached the wrapped exporter
    assert _nice(threading.get_native_id()) == main_before


@linux_only
def test_an_export_from_the_main_thread_leaves_its_priority_alone() -> None:
    inner = InMemorySpanExporter()
    exporter = BackgroundExporter(inner)
    before = _nice(threading.get_native_id())
    assert exporter.export(_spans(1)) == SpanExportResult.SUCCESS
    assert _nice(threading.get_native_id()) == before
    assert len(inner.get_finished_spans()) == 1


@linux_only
def test_lowering_stops_at_nineteen() -> None:
    result: dict[str, object] = {}

    def worker() -> None:
        tid = threading.get_native_id()
        start = max(15, _nice(tid))  # raising a nice value needs no privilege
        os.setpriority(os.PRIO_PROCESS, tid, start)
        result["first"] = lower_thread_priority(tid, 10) == (start < 19)
        result["nice"] = _nice(tid)
        result["again"] = lower_thread_priority(tid, 10)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result == {"first": True, "nice": 19, "again": False}


def test_an_unknown_thread_is_not_an_error() -> None:
    assert lower_thread_priority(2**22 + 12345, 10) is False


def test_flush_and_shutdown_reach_the_wrapped_exporter() -> None:
    inner = InMemorySpanExporter()
    exporter = BackgroundExporter(inner)
    assert exporter.force_flush(1000) is True
    exporter.shutdown()
    assert exporter.export(_spans(1)) == SpanExportResult.FAILURE  # the inner one is shut
