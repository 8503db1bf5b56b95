"""Results as one JSON document and as Markdown tables."""

from __future__ import annotations

import math
from typing import Any

from loadgen.runner import Plan, PointResult

_STATS = ("mean", "median", "p90", "p99", "trimmed_mean")


def _rate(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def point_key(point: PointResult) -> tuple[str, str, str]:
    """What makes two targets' points comparable: the same shape and load."""
    return point.shape.label, str(point.load.concurrency), str(point.load.rate)


def comparisons(points: list[PointResult], baseline: str | None) -> list[dict[str, Any]]:
    """Per grid point, each target's TTFT and E2E latency minus its baseline's.

    A target's baseline is its own ``vs=``, else the run's ``baseline``.
    """
    index = {(p.target.name, *point_key(p)): p for p in points}
    rows = []
    for point in points:
        ref_name = point.target.vs or baseline
        if ref_name is None or ref_name == point.target.name:
            continue
        ref = index.get((ref_name, *point_key(point)))
        if ref is None:
            continue
        row: dict[str, Any] = {
            "target": point.target.name,
            "baseline": ref_name,
            "shape": point.shape.label,
            "concurrency": point.load.concurrency,
            "request_rate": _rate(point.load.rate),
        }
        for metric in ("ttft_ms", "e2el_ms"):
            mine, theirs = point.summary[metric], ref.summary[metric]
            row["added_" + metric] = {
                stat: (
                    mine[stat] - theirs[stat]
                    if mine[stat] is not None and theirs[stat] is not None
                    else None
                )
                for stat in _STATS
            }
        rows.append(row)
    return rows


def document(
    plan: Plan, points: list[PointResult], baseline: str | None, command: str
) -> dict[str, Any]:
    """The JSON result: settings, every point's metrics, and the comparisons."""
    return {
        "tool": "tiergate bench",
        "command": command,
        "settings": {
            "endpoint": "chat" if plan.chat else "completions",
            "num_requests": plan.num_requests,
            "rounds": plan.rounds,
            "max_duration_s": plan.max_duration_s,
            "warmup": plan.warmup,
            "ignore_eos": plan.ignore_eos,
            "timeout_s": plan.timeout_s,
            "seed": plan.seed,
            "slo": plan.slo.as_dict(),
            "trim_fraction": plan.trim,
            "prompt_source": "file" if plan.file_prompts is not None else "synthetic",
        },
        "targets": [t.public() for t in plan.targets],
        "points": [
            {
                "target": p.target.name,
                "model": p.target.model,
                "shape": p.shape.label,
                "prompt_tokens": p.shape.prompt_tokens,
                "output_tokens": p.shape.output_tokens,
                "concurrency": p.load.concurrency,
                "request_rate": _rate(p.load.rate),
                "arrival": p.load.arrival,
                "metrics": p.summary,
            }
            for p in points
        ],
        "comparisons": comparisons(points, baseline),
    }


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _errors(summary: dict[str, Any]) -> str:
    by_status = summary["errors_by_status"]
    if not by_status:
        return "0"
    return " ".join(f"{status}:{count}" for status, count in by_status.items())


def markdown(doc: dict[str, Any]) -> str:
    """A table of every point, and one of the added latency when there is a baseline."""
    slo = doc["settings"]["slo"]
    head = (
        "| target | model | shape | conc | rate | ok | TTFT mean / p50 / p99 ms "
        "| TPOT mean / p50 / p99 ms | ITL p50 / p99 ms | E2EL p50 / p99 ms "
        "| out tok/s | req/s |" + (" goodput req/s |" if slo else "") + " errors |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in doc["points"]:
        m = p["metrics"]
        t, o, i, e = m["ttft_ms"], m["tpot_ms"], m["itl_ms"], m["e2el_ms"]
        conc = "-" if p["concurrency"] is None else p["concurrency"]
        row = (
            f"| {p['target']} | {p['model']} | {p['shape']} | {conc} | {p['request_rate']} "
            f"| {m['completed']}/{m['requests']} "
            f"| {_ms(t['mean'])} / {_ms(t['median'])} / {_ms(t['p99'])} "
            f"| {_ms(o['mean'], 2)} / {_ms(o['median'], 2)} / {_ms(o['p99'], 2)} "
            f"| {_ms(i['median'], 2)} / {_ms(i['p99'], 2)} "
            f"| {_ms(e['median'])} / {_ms(e['p99'])} "
            f"| {m['output_throughput']:.1f} | {m['request_throughput']:.2f} |"
        )
        if slo:
            row += f" {m['goodput']:.2f} |"
        lines.append(row + f" {_errors(m)} |")
    sources = sorted({p["metrics"]["tokens_counted_from"] for p in doc["points"]})
    lines += [
        "",
        f"Output tokens counted from: {', '.join(sources)} "
        "(usage = the stream's usage chunk; chunks = one per text chunk).",
    ]
    if slo:
        limits = ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
        lines.append(f"Goodput: successful requests per second with {limits}.")
    if doc["comparisons"]:
        lines += ["", _comparison_table(doc["comparisons"])]
    return "\n".join(lines) + "\n"


def _comparison_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| target | vs | shape | conc | rate | added TTFT mean / p50 / p99 ms "
        "| added E2EL p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t, e = r["added_ttft_ms"], r["added_e2el_ms"]
        conc = "-" if r["concurrency"] is None else r["concurrency"]
        lines.append(
            f"| {r['target']} | {r['baseline']} | {r['shape']} | {conc} "
            f"| {r['request_rate']} | {_ms(t['mean'], 2)} / {_ms(t['median'], 2)} / "
            f"{_ms(t['p99'], 2)} | {_ms(e['median'], 2)} |"
        )
    return "\n".join(lines)
