"""Routing-quality evaluation: AUC, accuracy, per-group tables, the share-vs-caught curve.

The curve answers the operator's question directly: if a share ``s`` of all requests goes to
the precise tier (the highest-scoring ones), which share of the complex requests is caught?
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from router_models import Router
from router_models.records import body_of, label_of

CATCH_TARGET: Final = 0.95
CURVE_SHARES: Final = tuple(round(0.05 * i, 2) for i in range(1, 21))


@dataclass(frozen=True, slots=True)
class GroupRow:
    """Results for one category or source."""

    name: str
    n: int
    n_complex: int
    mean_score: float
    accuracy: float
    precise_share_at_op: float
    roc_auc: float | None


@dataclass(frozen=True, slots=True)
class EvalReport:
    """Everything ``tiergate router eval`` prints."""

    n: int
    n_complex: int
    roc_auc: float
    default_threshold: float
    accuracy_at_default: float
    precise_share_at_default: float
    op_threshold: float
    op_complex_caught: float
    op_simple_sent: float
    op_precise_share: float
    curve: list[dict[str, float]] = field(default_factory=list)
    by_category: list[GroupRow] = field(default_factory=list)
    by_source: list[GroupRow] = field(default_factory=list)
    full_curve: list[dict[str, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the full curve, which only the plot needs)."""
        data = asdict(self)
        del data["full_curve"]
        return data


def roc_auc(labels: npt.NDArray[np.int_], scores: npt.NDArray[np.float64]) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    n_pos = int(labels.sum())
    n_neg = int(labels.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both labels")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.arange(1, scores.size + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]
    return float((ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def operating_threshold(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int_]) -> float:
    """Highest threshold that still catches ``CATCH_TARGET`` of the complex requests."""
    complex_scores = np.sort(scores[labels == 1])
    if complex_scores.size == 0:
        return float("inf")
    allowed_misses = int(np.floor((1.0 - CATCH_TARGET) * complex_scores.size + 1e-9))
    return float(complex_scores[allowed_misses])


def share_curve(
    scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int_]
) -> list[dict[str, float]]:
    """Share sent to precise vs share of complex caught, at every distinct threshold."""
    order = np.argsort(-scores, kind="stable")
    ranked, ranked_labels = scores[order], labels[order]
    n_complex = max(1, int(labels.sum()))
    n_simple = max(1, int(labels.size - labels.sum()))
    caught = np.cumsum(ranked_labels)
    sent = np.arange(1, ranked.size + 1)
    last_of_tie = np.append(ranked[1:] != ranked[:-1], True)
    return [
        {
            "threshold": float(ranked[i]),
            "precise_share": float(sent[i] / ranked.size),
            "complex_caught": float(caught[i] / n_complex),
            "simple_sent": float((sent[i] - caught[i]) / n_simple),
        }
        for i in np.flatnonzero(last_of_tie)
    ]


def _sample_curve(curve: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """The curve at the standard shares (first point reaching each share)."""
    points: list[dict[str, float]] = []
    for share in CURVE_SHARES:
        point = next((p for p in curve if p["precise_share"] >= share - 1e-12), curve[-1])
        points.append({"target_share": share, **point})
    return points


def _group_rows(
    names: Sequence[str],
    scores: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int_],
    default: float,
    op: float,
) -> list[GroupRow]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        groups[name].append(i)
    rows = []
    for name, members in sorted(groups.items()):
        s, y = scores[members], labels[members]
        both = 0 < y.sum() < y.size
        rows.append(
            GroupRow(
                name=name,
                n=int(y.size),
                n_complex=int(y.sum()),
                mean_score=float(s.mean()),
                accuracy=float(((s >= default) == (y == 1)).mean()),
                precise_share_at_op=float((s >= op).mean()),
                roc_auc=roc_auc(y, s) if both else None,
            )
        )
    return rows


def evaluate(router: Router, records: Sequence[Mapping[str, Any]]) -> EvalReport:
    """Score labelled records with ``router`` and summarise routing quality."""
    scores = np.array([router.score(body_of(r)) for r in records], dtype=np.float64)
    labels = np.array([label_of(r) for r in records], dtype=np.int_)
    if labels.min() == labels.max():
        raise ValueError("evaluation data needs both simple and complex examples")
    default = router.default_threshold
    op = operating_threshold(scores, labels)
    curve = share_curve(scores, labels)
    return EvalReport(
        n=int(labels.size),
        n_complex=int(labels.sum()),
        roc_auc=roc_auc(labels, scores),
        default_threshold=default,
        accuracy_at_default=float(((scores >= default) == (labels == 1)).mean()),
        precise_share_at_default=float((scores >= default).mean()),
        op_threshold=op,
        op_complex_caught=float((scores[labels == 1] >= op).mean()),
        op_simple_sent=float((scores[labels == 0] >= op).mean()),
        op_precise_share=float((scores >= op).mean()),
        curve=_sample_curve(curve),
        full_curve=curve,
        by_category=_group_rows(
            [str(r.get("category", "-")) for r in records], scores, labels, default, op
        ),
        by_source=_group_rows(
            [str(r.get("source", "-")) for r in records], scores, labels, default, op
        ),
    )


def _table(title: str, rows: Sequence[GroupRow]) -> list[str]:
    lines = [
        title,
        f"  {'name':<28}{'n':>6}{'complex':>9}{'mean p':>8}{'acc@def':>9}"
        f"{'precise@op':>11}{'auc':>7}",
    ]
    for r in rows:
        auc = f"{r.roc_auc:.3f}" if r.roc_auc is not None else "-"
        lines.append(
            f"  {r.name[:27]:<28}{r.n:>6}{r.n_complex:>9}{r.mean_score:>8.3f}{r.accuracy:>9.3f}"
            f"{r.precise_share_at_op:>11.3f}{auc:>7}"
        )
    return lines


def render_text(report: EvalReport) -> str:
    """Human-readable report."""
    lines = [
        f"examples: {report.n} ({report.n_complex} complex)",
        f"ROC AUC: {report.roc_auc:.4f}",
        f"default threshold {report.default_threshold:.4f}: accuracy "
        f"{report.accuracy_at_default:.3f}, precise share {report.precise_share_at_default:.3f}",
        f"operating point (catch {CATCH_TARGET:.0%} of complex): threshold "
        f"{report.op_threshold:.4f}, complex caught {report.op_complex_caught:.3f}, simple sent "
        f"to precise {report.op_simple_sent:.3f}, precise share {report.op_precise_share:.3f}",
        "",
        "share sent to precise -> share of complex caught (simple sent, threshold)",
    ]
    for p in report.curve:
        lines.append(
            f"  {p['target_share']:>5.2f} -> {p['complex_caught']:.3f}  "
            f"(simple {p['simple_sent']:.3f}, t={p['threshold']:.4f})"
        )
    lines += [
        "",
        *_table("by category (precise@op: share sent at the operating point)", report.by_category),
    ]
    lines += ["", *_table("by source", report.by_source)]
    return "\n".join(lines)


def plot(report: EvalReport, path: Path) -> None:
    """Save the share-vs-caught curve as a PNG (matplotlib imported only here)."""
    import matplotlib  # noqa: PLC0415 - optional dev dependency, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - must follow the backend choice

    fig, ax = plt.subplots(figsize=(6, 5), dpi=100)
    xs = [0.0] + [p["precise_share"] for p in report.full_curve]
    ys = [0.0] + [p["complex_caught"] for p in report.full_curve]
    ax.plot(xs, ys, label=f"router (AUC {report.roc_auc:.3f})")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="random")
    best = report.n_complex / report.n
    ax.plot([0, best, 1], [0, 1, 1], linestyle=":", color="green", label="perfect router")
    ax.scatter(
        [report.op_precise_share],
        [report.op_complex_caught],
        color="red",
        zorder=3,
        label=f"catch {CATCH_TARGET:.0%}: simple sent {report.op_simple_sent:.1%}",
    )
    ax.set_xlabel("share of requests sent to the precise tier")
    ax.set_ylabel("share of complex requests caught")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
