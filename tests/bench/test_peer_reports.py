"""The peers' rows in the overhead and prefix reports: ratios, issue 16's targets, comparisons."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.harness.legs import Leg, LegUnavailableError, Placement
from bench.harness.points import Bench, Series
from bench.harness.processes import Service
from bench.harness.wrk import WrkResult, WrkRunner, lua_script
from bench.overhead.peers import ensure_portkey, nginx_config, vllm_router_command
from bench.overhead.report import Report, checks, render
from bench.overhead.run import LEGS, make_plan, memory_steps, parse_args, run_peer
from bench.prefix.report import PEER, Row, peer_lines


def _point(rps: float, p50_ms: float) -> WrkResult:
    return WrkResult(int(rps * 10), 10.0, 0, 0, p50_ms, p50_ms * 2, p50_ms * 4, p50_ms)


def _series(role: str, rps: float, p50_ms: float = 1.0) -> Series:
    return Series(role, role, {c: _point(rps, p50_ms) for c in (1, 16, 64)})


def _report(variant: str) -> Report:
    report = Report("t", "cmd", [], variant=variant)
    report.series = [
        _series("direct", 20000, 0.05),
        _series("nginx", 18000),
        _series("vllm-router", 10000),
        _series("tiergate", 3000, 0.70),
        _series("portkey", 1000),
        _series("litellm", 100),
    ]
    return report


def test_full_variant_checks_issue_16_targets() -> None:
    """Variant full: added p50 <= 0.7 ms, >= 20x LiteLLM and >= 1.5x Portkey at c=16/64."""
    verdicts = {c.name: (c.value, c.passed) for c in checks(_report("full"))}
    assert verdicts["issue 16, full: TierGate added p50 at c=1"] == ("0.65 ms", True)
    assert verdicts["issue 16, full: TierGate / LiteLLM req/s at c=16"] == ("30.00x", True)
    assert verdicts["issue 16, full: TierGate / Portkey req/s at c=64"] == ("3.00x", True)
    assert not any(name.startswith("issue 16, plain") for name in verdicts)


def test_plain_variant_checks_vllm_router_share() -> None:
    """Variant plain: TierGate must reach 0.35x vllm-router at c=16 (here 0.30x: FAIL)."""
    verdicts = {c.name: (c.value, c.passed) for c in checks(_report("plain"))}
    assert verdicts["issue 16, plain: TierGate / vllm-router req/s at c=16"] == ("0.30x", False)
    assert not any(name.startswith("issue 16, full") for name in verdicts)


def test_missing_peer_is_not_measured_and_ratios_list_present_ones() -> None:
    """Without Portkey its checks are n/a; the ratio table has a row per peer that ran."""
    report = _report("full")
    report.series = [s for s in report.series if s.role != "portkey"]
    report.unavailable["Portkey"] = "node and npm are needed"
    text = render(report)
    assert (
        "| issue 16, full: TierGate / Portkey req/s at c=16 | not measured | ≥ 1.50x | n/a |"
        in text
    )
    assert "| vllm-router | 0.30x | 0.30x | 0.30x |" in text
    assert "| nginx | 0.17x | 0.17x | 0.17x |" in text
    assert "| Portkey |" not in text
    assert "- Portkey: node and npm are needed" in text


def test_lua_script_sends_extra_headers_escaped() -> None:
    """Portkey's routing headers go into the wrk script as escaped Lua strings."""
    script = lua_script({}, "sk-1", headers={"x-portkey-custom-host": 'http://h/"v1"'})
    assert 'wrk.headers["x-portkey-custom-host"] = "http://h/\\"v1\\""' in script
    assert 'wrk.headers["Authorization"] = "Bearer sk-1"' in script


def test_nginx_config_keeps_upstream_connections_alive(tmp_path: Path) -> None:
    """nginx runs one worker, proxies over HTTP/1.1 keep-alive and logs no access lines."""
    upstream = Leg(
        "up", "http://127.0.0.1:9001", "m", None, Service("up", [], 9001, tmp_path / "l")
    )
    text = nginx_config(tmp_path, 9002, upstream)
    for line in (
        "worker_processes 1;",
        "server 127.0.0.1:9001;",
        "keepalive 128;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "listen 127.0.0.1:9002;",
        "access_log off;",
    ):
        assert line in text


def test_vllm_router_command_pins_and_names_policy() -> None:
    """The router runs under the proxy placement with the policy and every worker URL."""
    pin = Placement(("taskset", "-c", "0"), ("taskset", "-c", "1"))
    cmd = vllm_router_command(Path("/r"), 5, ["http://a", "http://b"], "cache_aware", pin)
    assert cmd[:4] == ["taskset", "-c", "0", "/r"]
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[-3:] == ["--worker-urls", "http://a", "http://b"]


def test_memory_steps_parse_and_refuse_bad_input() -> None:
    """--memory-requests takes increasing positive counts; anything else is a usage error."""
    assert memory_steps("20000,200_000") == (20_000, 200_000)
    for bad in ("20000", "200000,20000", "0,10", "a,b"):
        with pytest.raises(argparse.ArgumentTypeError):
            memory_steps(bad)
    assert LEGS == (
        "direct",
        "nginx",
        "vllm-router",
        "python-floor",
        "tiergate",
        "portkey",
        "litellm",
    )


def _row(strategy: str, hit: float, ttft: float) -> Row:
    return Row("grouped", strategy, 10, 0, hit, ttft, ttft, ttft, 1.0, 1.1, (3, 3, 2, 2))


def test_prefix_peer_table_compares_affinity_with_vllm_router() -> None:
    """The prefix report compares one-gateway affinity with cache_aware; none without a peer."""
    rows = [_row("prefix_affinity", 0.7, 50.0), _row(PEER, 0.2, 150.0)]
    text = "\n".join(peer_lines(rows))
    assert "| grouped | 0 | 70.0% vs 20.0% | 3.00x | 1.10 vs 1.10 | 0 vs 0 |" in text
    assert peer_lines(rows[:1]) == []


def test_peer_that_cannot_install_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without node/npm on PATH the Portkey leg is skipped and the report says why."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LegUnavailableError, match="node and npm are needed"):
        ensure_portkey()
    report = Report("t", "cmd", [])
    pin = Placement((), ())
    bench = Bench(WrkRunner("wrk", tmp_path, ()), make_plan(parse_args([])), tmp_path, pin)
    upstream = Leg("up", "http://127.0.0.1:9", "m", None, Service("up", [], 9, tmp_path / "l"))
    run_peer(report, bench, "portkey", upstream)
    assert report.series == []
    assert "node and npm are needed" in report.unavailable["Portkey"]
    assert "- Portkey: node and npm are needed" in render(report)


def test_a_near_miss_shows_enough_digits_to_see_why_it_fails() -> None:
    """A ratio just under its target is not rounded up to the target in the report."""
    report = _report("full")
    report.series = [s for s in report.series if s.role != "portkey"]
    report.series.append(_series("portkey", 3000 / 1.4997))
    verdicts = {c.name: (c.value, c.passed) for c in checks(report)}
    assert verdicts["issue 16, full: TierGate / Portkey req/s at c=16"] == ("1.4997", False)
