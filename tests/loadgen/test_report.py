"""The JSON document, the Markdown tables and the direct-vs-gateway comparisons."""

from __future__ import annotations

import json

import pytest

from loadgen.client import RequestResult
from loadgen.metrics import summarise
from loadgen.report import comparisons, document, markdown
from loadgen.runner import Plan, PointResult, _shares
from loadgen.spec import Load, Shape, Slo, Target

SHAPE = Shape("short", 64, "short", 8)
LOAD = Load(1, float("inf"))


def _point(target: Target, ttft: float) -> PointResult:
    results = [
        RequestResult(
            ok=True,
            status="200",
            ttft=ttft,
            e2el=ttft + 0.07,
            output_tokens=8,
            counted_from="usage",
        )
        for _ in range(3)
    ]
    return PointResult(target, SHAPE, LOAD, summarise(results, 1.0, Slo(ttft_ms=30), 0.0))


def _plan(targets: list[Target]) -> Plan:
    return Plan(
        targets=targets,
        shapes=[SHAPE],
        loads=[LOAD],
        num_requests=3,
        max_duration_s=10,
        warmup=1,
        chat=True,
        ignore_eos=True,
        timeout_s=10,
        seed=0,
        slo=Slo(ttft_ms=30),
        trim=0.0,
    )


def test_each_target_is_compared_with_its_own_vs() -> None:
    """gw-fast is compared with direct-fast and gw-precise with direct-precise, never across."""
    d_fast = Target("direct-fast", "http://a", "tiergate-fast")
    d_prec = Target("direct-precise", "http://b", "tiergate-precise")
    g_fast = Target("gw-fast", "http://g", "fast", vs="direct-fast")
    g_prec = Target("gw-precise", "http://g", "precise", vs="direct-precise")
    points = [
        _point(d_fast, 0.010),
        _point(g_fast, 0.013),
        _point(d_prec, 0.020),
        _point(g_prec, 0.022),
    ]
    rows = {r["target"]: r for r in comparisons(points, None)}
    assert set(rows) == {"gw-fast", "gw-precise"}
    assert rows["gw-fast"]["baseline"] == "direct-fast"
    assert rows["gw-fast"]["added_ttft_ms"]["median"] == pytest.approx(3.0)
    assert rows["gw-precise"]["added_ttft_ms"]["median"] == pytest.approx(2.0)


def test_document_and_markdown_carry_no_key_and_show_goodput() -> None:
    """The JSON names the auth kind, never the key; the tables show goodput and the deltas."""
    direct = Target("direct", "http://a", "m", api_key="sk-hidden")
    gateway = Target("gateway", "http://g", "fast", api_key="sk-hidden")
    points = [_point(direct, 0.010), _point(gateway, 0.025)]
    doc = document(_plan([direct, gateway]), points, "direct", "tiergate bench ...")
    text = json.dumps(doc)
    assert "sk-hidden" not in text
    assert doc["targets"][0]["auth"] == "bearer"
    table = markdown(doc)
    assert "goodput req/s" in table
    assert "| direct | m | short/short | 1 | inf | 3/3 | 10.0 / 10.0 / 10.0 |" in table
    assert "| gateway | direct | short/short | 1 | inf | 15.00 / 15.00 / 15.00 |" in table
    assert "Goodput: successful requests per second with ttft_ms <= 30." in table
    assert doc["points"][1]["metrics"]["goodput"] == pytest.approx(3.0)  # 25 ms <= 30


def test_rounds_share_the_requests_evenly() -> None:
    """10 requests in 3 rounds are 4 + 3 + 3; more rounds than requests leave empty ones."""
    assert _shares(10, 3) == [4, 3, 3]
    assert _shares(2, 3) == [1, 1, 0]
