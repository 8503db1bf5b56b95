"""TTFT and TPOT against concurrency, one line per target and shape (needs matplotlib)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install 'tiergate[plot]'``)."""


def _series(doc: dict[str, Any], metric: str) -> dict[str, list[tuple[int, float]]]:
    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for p in doc["points"]:
        value = p["metrics"][metric]["median"]
        if p["concurrency"] is None or value is None:
            continue
        rate = p["request_rate"]
        label = f"{p['target']} ({p['model']}) {p['shape']}"
        if rate != "inf":
            label += f" @{rate}/s"
        lines[label].append((int(p["concurrency"]), float(value)))
    return {k: sorted(v) for k, v in lines.items()}


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """Two panels, median TTFT and median TPOT, against concurrency (log 2 axis)."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional extra, loaded only to plot

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - same
    except ImportError:
        raise PlotUnavailable("the plot needs matplotlib: pip install 'tiergate[plot]'") from None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, metric, title in ((axes[0], "ttft_ms", "TTFT p50 (ms)"),
                              (axes[1], "tpot_ms", "TPOT p50 (ms)")):
        series = _series(doc, metric)
        for label, pts in series.items():
            ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=label)
        levels = sorted({c for pts in series.values() for c, _ in pts})
        if len(levels) > 1 and levels[-1] / max(levels[0], 1) >= 4:
            ax.set_xscale("log", base=2)
        if levels:
            ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(title)
        ax.set_ylim(bottom=0)
        ax.grid(visible=True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)),
                   fontsize="small")
    rows = math.ceil(len(labels) / 3) if labels else 0
    fig.suptitle("tiergate bench")
    fig.tight_layout(rect=(0, 0.06 * rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
