"""TTFT and TPOT against concurrency: a row per shape, a line per target (needs matplotlib)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

Series = dict[str, list[tuple[int, float]]]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install 'tiergate[plot]'``)."""


def rows(doc: dict[str, Any], metric: str) -> dict[str, Series]:
    """{shape (and rate): {target (model): [(concurrency, median), ...]}}; uncapped points
    have no concurrency to plot against and are left out."""
    panels: dict[str, Series] = defaultdict(lambda: defaultdict(list))
    for p in doc["points"]:
        value = p["metrics"][metric]["median"]
        if p["concurrency"] is None or value is None:
            continue
        row = p["shape"] if p["request_rate"] == "inf" else f"{p['shape']} @{p['request_rate']}/s"
        panels[row][f"{p['target']} ({p['model']})"].append((int(p["concurrency"]), value))
    return {row: {k: sorted(v) for k, v in lines.items()} for row, lines in panels.items()}


def _draw(ax: Any, series: Series, title: str) -> None:
    for label, pts in series.items():
        ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=label)
    levels = sorted({c for pts in series.values() for c, _ in pts})
    if len(levels) > 1 and levels[-1] / max(levels[0], 1) >= 4:
        ax.set_xscale("log", base=2)
    if levels:
        ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("concurrency")
    ax.set_ylim(bottom=0)
    ax.grid(visible=True, alpha=0.3)


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """Median TTFT (left) and median TPOT (right) in ms, one row per prompt/output shape."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional extra, loaded only to plot

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - same
    except ImportError:
        raise PlotUnavailable("the plot needs matplotlib: pip install 'tiergate[plot]'") from None
    ttft, tpot = rows(doc, "ttft_ms"), rows(doc, "tpot_ms")
    names = list(ttft) or ["(no capped points)"]
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.2 * len(names) + 0.8), squeeze=False)
    for i, name in enumerate(names):
        _draw(axes[i][0], ttft.get(name, {}), f"{name}: TTFT p50 (ms)")
        _draw(axes[i][1], tpot.get(name, {}), f"{name}: TPOT p50 (ms)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles,
            labels,
            loc="upper center",
            ncol=min(4, len(labels)),
            fontsize="small",
            bbox_to_anchor=(0.5, 1.0),
        )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(path, dpi=100)
    plt.close(fig)
