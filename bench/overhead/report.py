"""Turn benchmark measurements into the Markdown report and its PASS/FAIL checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bench.harness.points import NOISY_WAIT, Series
from bench.harness.wrk import WrkResult

# Targets from the issue (2-core machine, one worker each).
MIN_RATIO_VS_LITELLM = 10.0
MAX_ADDED_P50_MS = 1.0
MIN_C64_OVER_C16 = 0.90
MAX_RSS_GROWTH = 0.10
# Issue 16's targets, one run, ratios: the full path and the plain path against the peers.
FULL_MAX_ADDED_P50_MS = 0.7
FULL_MIN_RATIO_VS_LITELLM = 20.0
FULL_MIN_RATIO_VS_PORTKEY = 1.5
PLAIN_MIN_RATIO_VS_VLLM_ROUTER = 0.35
PEER_ROLES = {
    "nginx": "nginx",
    "vllm-router": "vllm-router",
    "python-floor": "Python floor",
    "portkey": "Portkey",
    "litellm": "LiteLLM",
}
MIN_UPSTREAM_HEADROOM = 2.0  # the upstream must serve >= 2x what TierGate does through it


@dataclass(frozen=True)
class MemorySample:
    """TierGate's resident memory after a number of requests."""

    requests: int
    rss_mib: float
    elapsed_s: float = 0.0  # wall time of the step that ended here


@dataclass
class MemoryMix:
    """What the memory phase sent (kind, expected status, share per cycle) and what came back."""

    kinds: list[tuple[str, int, int]]
    omitted: list[str] = field(default_factory=list)  # kinds this variant cannot produce
    statuses: dict[int, int] = field(default_factory=dict)
    socket_errors: int = 0

    def unexpected(self) -> list[str]:
        """Problems with the answers: a 5xx, or an expected status never answered."""
        out = [f"{n:,} answers {s}" for s, n in sorted(self.statuses.items()) if s >= 500]
        for status in sorted({k[1] for k in self.kinds}):
            if not self.statuses.get(status):
                out.append(f"no {status} answer")
        return out


@dataclass
class Report:
    """Everything one run measured, plus what could not be measured and why."""

    title: str
    command: str
    environment: list[str]
    series: list[Series] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    memory_mix: MemoryMix | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    variant: str = "plain"
    memory_only: bool = False  # --memory-only: no throughput points, only the memory checks

    def find(self, role: str) -> Series | None:
        """The series of a role, if it ran."""
        return next((s for s in self.series if s.role == role), None)


@dataclass(frozen=True)
class Check:
    """One derived number compared with its target."""

    name: str
    value: str
    target: str
    passed: bool | None  # None: not measurable in this run


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _times(v: float) -> str:
    return f"{v:.2f}x"


def _ms(v: float) -> str:
    return f"{v:.2f} ms"


def _plain(v: float) -> str:
    return f"{v:.3f}"


def _pct(v: float) -> str:
    return f"{v:+.1%}"


def memory_checks(report: Report) -> list[Check]:
    """RSS growth from the first to the last step, and the mix's answers."""
    growth = None
    if len(report.memory) >= 2 and report.memory[0].rss_mib > 0:
        growth = report.memory[-1].rss_mib / report.memory[0].rss_mib - 1
    name = "TierGate RSS growth, last vs first"
    out = [_check(name, growth, MAX_RSS_GROWTH, _pct, at_least=False)]
    if report.memory_mix is not None:
        problems = report.memory_mix.unexpected()
        out.append(
            Check(
                "memory mix: every expected status answered, no 5xx",
                "; ".join(problems) or "yes",
                "yes",
                not problems,
            )
        )
    return out


def checks(report: Report) -> list[Check]:
    """The issue's targets, each with the measured value (only memory's in a memory-only run)."""
    if report.memory_only:
        return memory_checks(report)
    tg, ll, direct = report.find("tiergate"), report.find("litellm"), report.find("direct")
    out: list[Check] = []
    for c in (16, 64):
        r = _ratio(tg.rps(c) if tg else None, ll.rps(c) if ll else None)
        out.append(_check(f"TierGate / LiteLLM req/s at c={c}", r, MIN_RATIO_VS_LITELLM, _times))
    added = None
    if tg and direct and 1 in tg.points and 1 in direct.points:
        added = tg.points[1].p50_ms - direct.points[1].p50_ms
    out.append(_check("TierGate added p50 at c=1", added, MAX_ADDED_P50_MS, _ms, at_least=False))
    r = _ratio(tg.rps(64) if tg else None, tg.rps(16) if tg else None)
    out.append(_check("TierGate req/s c=64 / c=16", r, MIN_C64_OVER_C16, _plain))
    out += memory_checks(report)
    for c in (16, 64):
        r = _ratio(direct.rps(c) if direct else None, tg.rps(c) if tg else None)
        name = f"upstream headroom: direct / TierGate req/s at c={c}"
        out.append(_check(name, r, MIN_UPSTREAM_HEADROOM, _times))
    return out + peer_checks(report, added)


def _vs(report: Report, role: str, c: int) -> float | None:
    tg, peer = report.find("tiergate"), report.find(role)
    return _ratio(tg.rps(c) if tg else None, peer.rps(c) if peer else None)


def peer_checks(report: Report, added_p50_ms: float | None) -> list[Check]:
    """Issue 16's targets for the variant that ran (``full``: the full path; ``plain``)."""
    if report.variant == "plain":
        r = _vs(report, "vllm-router", 16)
        name = "issue 16, plain: TierGate / vllm-router req/s at c=16"
        return [_check(name, r, PLAIN_MIN_RATIO_VS_VLLM_ROUTER, _times)]
    if report.variant != "full":
        return []
    name = "issue 16, full: TierGate added p50 at c=1"
    out = [_check(name, added_p50_ms, FULL_MAX_ADDED_P50_MS, _ms, at_least=False)]
    targets = (("litellm", FULL_MIN_RATIO_VS_LITELLM), ("portkey", FULL_MIN_RATIO_VS_PORTKEY))
    for role, target in targets:
        for c in (16, 64):
            name = f"issue 16, full: TierGate / {PEER_ROLES[role]} req/s at c={c}"
            out.append(_check(name, _vs(report, role, c), target, _times))
    return out


def ratio_lines(report: Report) -> list[str]:
    """TierGate's req/s over each peer's, at every concurrency, from this run."""
    peers = [(role, label) for role, label in PEER_ROLES.items() if report.find(role)]
    if not report.find("tiergate") or not peers:
        return []
    lines = ["", "TierGate req/s / peer req/s, same run:", ""]
    lines += ["| peer | c=1 | c=16 | c=64 |", "|---|---:|---:|---:|"]
    for role, _ in peers:
        series = report.find(role)
        cells = [_vs(report, role, c) for c in (1, 16, 64)]
        shown = [_times(v) if v is not None else "n/a" for v in cells]
        lines.append(f"| {series.label if series else role} | " + " | ".join(shown) + " |")
    return lines


def _check(
    name: str,
    value: float | None,
    target: float,
    fmt: Callable[[float], str],
    at_least: bool = True,
) -> Check:
    shown_target = ("≥ " if at_least else "≤ ") + fmt(target).lstrip("+")
    if value is None:
        return Check(name, "not measured", shown_target, None)
    passed = value >= target if at_least else value <= target
    shown = fmt(value)
    if not passed and shown == fmt(target):  # 1.497x must not read as a failing 1.50x
        shown = f"{value:.4f}"
    return Check(name, shown, shown_target, passed)


def _errors(point: WrkResult) -> str:
    bad = point.errors + point.non_2xx
    return "0" if bad == 0 else f"**{bad}**"


def _share(share: float | None) -> str:
    return "?" if share is None else f"{share:.0%}"


def _wait_cell(series: Series, c: int) -> str:
    share = series.wait.get(c)
    shown = _share(share)
    if series.role in ("upstream", "direct"):
        return shown + "†"
    return f"**{shown}**" if share is not None and share > NOISY_WAIT else shown


def mix_lines(mix: MemoryMix) -> list[str]:
    """The memory phase's request mix and the answers it got, by status."""
    cycle = sum(k[2] for k in mix.kinds)
    lines = ["", f"Memory-phase mix (one cycle of {cycle} requests, repeated):", ""]
    lines += ["| kind | expected status | per cycle |", "|---|---:|---:|"]
    lines += [f"| {name} | {status} | {n} |" for name, status, n in mix.kinds]
    answers = ", ".join(f"{s}: {n:,}" for s, n in sorted(mix.statuses.items()))
    lines += ["", f"Answers by status: {answers or 'none'}; socket errors: {mix.socket_errors:,}."]
    if mix.omitted:
        lines.append("Not in this variant's mix (auth is off): " + "; ".join(mix.omitted) + ".")
    return lines


def _points_lines(report: Report) -> list[str]:
    """The throughput and latency table, with its legend."""
    lines: list[str] = []
    lines += [
        "",
        "| setup | c | req/s | p50 ms | p99 ms | errors | run-queue wait | other CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for series in report.series:
        for c, p in sorted(series.points.items()):
            lines.append(
                f"| {series.label} | {c} | {p.rps:,.0f} | {p.p50_ms:.2f} | {p.p99_ms:.2f} "
                f"| {_errors(p)} | {_wait_cell(series, c)} "
                f"| {_share(series.foreign.get(c))} |"
            )
    noisy = any(
        v > NOISY_WAIT
        for s in report.series
        if s.role not in ("upstream", "direct")
        for v in s.wait.values()
    )
    lines += [
        "",
        "*run-queue wait*: time the servers' threads were runnable but not running, as a share "
        "of the point (their own threads competing count too; † direct rows: the upstream shares "
        "its core with wrk by design, so that wait is expected); *other CPU*: share of the "
        "machine used by processes outside the benchmark, which mostly fills idle cycles "
        "since the benchmark runs at high priority."
        + (
            " A **bold** wait means the server was held back, by other processes or by its own "
            "threads competing for its single core (LiteLLM runs several): rerun "
            "(`--noisy-retries 2`) to tell the two apart."
            if noisy
            else ""
        ),
    ]
    return lines


def render(report: Report) -> str:
    """The Markdown document: environment, results table, memory, checks, gaps."""
    lines = [f"# {report.title}", "", "Command:", "", "```", report.command, "```", ""]
    lines += [f"- {item}" for item in report.environment]
    if not report.memory_only:
        lines += _points_lines(report)
    if report.memory:
        lines += ["", "TierGate resident memory (VmRSS of the serving process):", ""]
        lines += ["| requests served | RSS MiB | step wall time s |", "|---:|---:|---:|"]
        lines += [
            f"| {m.requests:,} | {m.rss_mib:.1f} | {m.elapsed_s:.0f} |" for m in report.memory
        ]
    if report.memory_mix is not None:
        lines += mix_lines(report.memory_mix)
    lines += ratio_lines(report)
    lines += ["", "| check | measured | target | result |", "|---|---:|---:|---|"]
    for check in checks(report):
        verdict = {True: "PASS", False: "**FAIL**", None: "n/a"}[check.passed]
        lines.append(f"| {check.name} | {check.value} | {check.target} | {verdict} |")
    if report.unavailable:
        lines += ["", "Not measured in this run:", ""]
        for name, why in report.unavailable.items():
            first = why.strip().splitlines()[0] if why.strip() else "unknown reason"
            lines.append(f"- {name}: {first[:300]}")
    return "\n".join(lines) + "\n"
