"""Honest evaluation: leave-one-source-out, leave-one-family-out, reliability, cue checks.

* **Leave-one-source-out (LOSO)**: for every external source in the training data, train on
  the corpus plus the trainable rows of every *other* external source, then score all rows of
  the held-out source (its ``eval`` rows included: they are never trained on anyway).
* **Leave-one-family-out (LOFO)**: the same over the generator families of our own corpus
  (``corpus/<category>``), with every external trainable row in training.
* Each fold is calibrated with Platt on the group-held-out margins of the rows *outside* the
  held-out group, so the held-out rows never shape their own calibration.
* **Cue checks** (README-dev2.md): the held-out rows are scored again with a cue removed or
  added (trailing question mark, the word "python"); a router that learned the cue moves.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from router_models.artifact import FloatArray
from router_models.records import body_of
from router_models.training.crossval import held_out_margins, platt, sigmoid
from router_models.training.evaluate import operating_threshold, roc_auc
from router_models.training.train import Prepared, TrainSettings, featurize

ECE_BINS: Final = 10
_PYTHON_RE: Final = re.compile(r"\s*\bpython\b", re.IGNORECASE)
# ISO 639-1 codes a dataset category may name (dev2 writes e.g. ``so_title/ja``).
_LANGUAGES: Final = frozenset(
    (
        "ar",
        "bn",
        "ca",
        "cs",
        "da",
        "de",
        "el",
        "en",
        "es",
        "et",
        "eu",
        "fa",
        "fi",
        "fr",
        "gl",
        "he",
        "hi",
        "hu",
        "id",
        "it",
        "ja",
        "ko",
        "nl",
        "no",
        "pl",
        "pt",
        "ro",
        "ru",
        "sk",
        "sv",
        "sw",
        "ta",
        "te",
        "th",
        "tr",
        "uk",
        "ur",
        "vi",
        "zh",
    )
)


def _strip_question(text: str) -> str:
    return text.rstrip().rstrip("?\uff1f\u061f").rstrip()


def _add_question(text: str) -> str:
    return text.rstrip() + "?"


def _mask_python(text: str) -> str:
    return _PYTHON_RE.sub("", text).strip()


@dataclass(frozen=True, slots=True)
class Cue:
    """A transformation that removes or adds one dataset cue, and where it applies."""

    name: str
    applies: Callable[[str, int], bool]
    transform: Callable[[str], str]


CUES: Final = (
    Cue(
        "strip trailing '?' (simple rows ending in '?')",
        lambda t, y: y == 0 and t.rstrip().endswith(("?", "\uff1f", "\u061f")),
        _strip_question,
    ),
    Cue(
        "add trailing '?' (complex rows not ending in '?')",
        lambda t, y: y == 1 and not t.rstrip().endswith(("?", "\uff1f")),
        _add_question,
    ),
    Cue(
        "remove the word 'python' (rows containing it)",
        lambda t, y: _PYTHON_RE.search(t) is not None,
        _mask_python,
    ),
)


@dataclass(frozen=True, slots=True)
class Reliability:
    """Ranking and calibration quality of a set of held-out predictions."""

    n: int
    n_complex: int
    roc_auc: float
    op_threshold: float
    simple_sent_at_95: float
    brier: float
    ece: float
    caught_at_half: float
    simple_sent_at_half: float


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """Held-out figures of one source, family or language."""

    name: str
    n: int
    n_complex: int
    mean_score: float
    roc_auc: float | None
    sent_at_op: float
    sent_at_half: float


@dataclass(frozen=True, slots=True)
class CueFigures:
    """Scores of the affected held-out rows before and after a cue transformation."""

    name: str
    n: int
    mean_before: float
    mean_after: float
    sent_at_op_before: float
    sent_at_op_after: float
    max_abs_change: float


@dataclass(frozen=True, slots=True)
class HeldOutReport:
    """Everything ``tiergate router eval --held-out`` prints."""

    loso: Reliability
    loso_sources: list[GroupFigures]
    loso_languages: list[GroupFigures]
    cues: list[CueFigures]
    lofo: Reliability
    lofo_families: list[GroupFigures]
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def reliability(y: npt.NDArray[np.int_], p: FloatArray) -> Reliability:
    """AUC, simple sent at 95 % caught, Brier score and ECE of predictions ``p``."""
    op = operating_threshold(p, y)
    bins = np.minimum((p * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    ece = 0.0
    for b in range(ECE_BINS):
        inside = bins == b
        if inside.any():
            ece += inside.mean() * abs(float(p[inside].mean()) - float(y[inside].mean()))
    return Reliability(
        n=int(y.size),
        n_complex=int(y.sum()),
        roc_auc=roc_auc(y, p),
        op_threshold=op,
        simple_sent_at_95=float((p[y == 0] >= op).mean()),
        brier=float(np.mean((p - y) ** 2)),
        ece=float(ece),
        caught_at_half=float((p[y == 1] >= 0.5).mean()),
        simple_sent_at_half=float((p[y == 0] >= 0.5).mean()),
    )


def group_figures(
    names: Sequence[str], y: npt.NDArray[np.int_], p: FloatArray, op: float
) -> list[GroupFigures]:
    """Per-group rows: size, mean score, AUC when both labels occur, share sent."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        members[name].append(i)
    rows = []
    for name, idx in sorted(members.items()):
        gy, gp = y[idx], p[idx]
        both = 0 < gy.sum() < gy.size
        rows.append(
            GroupFigures(
                name=name,
                n=int(gy.size),
                n_complex=int(gy.sum()),
                mean_score=float(gp.mean()),
                roc_auc=roc_auc(gy, gp) if both else None,
                sent_at_op=float((gp >= op).mean()),
                sent_at_half=float((gp >= 0.5).mean()),
            )
        )
    return rows


def language_of(record: Mapping[str, Any]) -> str:
    """The language a dev2-style ``category`` names (``so_title/es``), else ``en``."""
    for part in str(record.get("category", "")).split("/"):
        if part in _LANGUAGES:
            return part
    return "en"


def _text(record: Mapping[str, Any]) -> str:
    prompt = record.get("prompt")
    return prompt if isinstance(prompt, str) else ""


@dataclass(slots=True)
class _Fold:
    """Calibrated held-out scores of one leave-group-out pass, plus cue-variant scores."""

    scores: FloatArray
    cue_scores: dict[str, dict[int, float]]


def _leave_out(
    data: Prepared,
    settings: TrainSettings,
    held: Sequence[str],
    calib: FloatArray,
    cues: Sequence[Cue],
) -> _Fold:
    names = np.asarray(data.groups)
    fit = settings.fitter()
    scores = np.full(data.y.size, np.nan)
    cue_scores: dict[str, dict[int, float]] = {c.name: {} for c in cues}
    for group in held:
        inside = names == group
        use = data.train_mask & ~inside
        model = fit(data.x_fit[use], data.y[use], data.weight[use])
        calib_rows = data.train_mask & ~inside
        a, c = platt(calib[calib_rows], data.y[calib_rows], data.calib_weight[calib_rows])
        rows = np.flatnonzero(inside)
        scores[rows] = sigmoid(a * model.margins(data.x[rows]) + c)
        for cue in cues:
            hit = [int(i) for i in rows if cue.applies(_text(data.records[i]), int(data.y[i]))]
            if not hit:
                continue
            bodies = [
                {**body_of(data.records[i]), "prompt": cue.transform(_text(data.records[i]))}
                for i in hit
            ]
            changed = sigmoid(a * model.margins(featurize(bodies)) + c)
            cue_scores[cue.name].update(zip(hit, changed.tolist(), strict=True))
    return _Fold(scores, cue_scores)


def _cue_figures(fold: _Fold, op: float) -> list[CueFigures]:
    out = []
    for name, changed in fold.cue_scores.items():
        if not changed:
            continue
        idx = np.array(sorted(changed))
        before = fold.scores[idx]
        after = np.array([changed[i] for i in idx])
        out.append(
            CueFigures(
                name=name,
                n=int(idx.size),
                mean_before=float(before.mean()),
                mean_after=float(after.mean()),
                sent_at_op_before=float((before >= op).mean()),
                sent_at_op_after=float((after >= op).mean()),
                max_abs_change=float(np.abs(after - before).max()),
            )
        )
    return out


def _calibration_margins(data: Prepared, settings: TrainSettings) -> FloatArray:
    """Every trainable row's margin from a fit that left its group out (Platt's inputs)."""
    return (
        held_out_margins(
            data.x,
            data.y,
            data.weight,
            data.groups,
            data.train_mask,
            settings.fitter(),
            sorted({g for g, m in zip(data.groups, data.train_mask, strict=True) if m}),
            fit_x=data.x_fit,
        )
        if data.train_mask.any()
        else np.zeros(0)
    )


def _external_groups(data: Prepared) -> list[str]:
    return sorted({g for g in data.groups if not g.startswith("corpus/")})


def loso_scores(data: Prepared, settings: TrainSettings) -> FloatArray:
    """The calibrated leave-one-source-out score of every external row (NaN elsewhere)."""
    calib = _calibration_margins(data, settings)
    return _leave_out(data, settings, _external_groups(data), calib, ()).scores


def with_sources_perfect(
    groups: Sequence[str], y: npt.NDArray[np.int_], scores: FloatArray, perfect: Set[str]
) -> Reliability:
    """Pooled figures if the rows of ``perfect`` were scored 0 (simple) / 1 (complex).

    A counterfactual: how far from a target the router would be with one failure shape solved
    outright and every other score unchanged.
    """
    fixed = np.array([g in perfect for g in groups], dtype=np.bool_)
    return reliability(y, np.where(fixed, y.astype(np.float64), scores))


def held_out_report(data: Prepared, settings: TrainSettings) -> HeldOutReport:
    """LOSO over the external sources and LOFO over the corpus families of ``data``."""
    calib = _calibration_margins(data, settings)
    external = _external_groups(data)
    families = sorted({g for g in data.groups if g.startswith("corpus/")})
    y = data.y.astype(np.int_)
    loso = _leave_out(data, settings, external, calib, CUES)
    ext = np.flatnonzero(~np.isnan(loso.scores))
    loso_rel = reliability(y[ext], loso.scores[ext])
    lofo = _leave_out(data, settings, families, calib, ())
    fam = np.flatnonzero(~np.isnan(lofo.scores))
    lofo_rel = reliability(y[fam], lofo.scores[fam])
    return HeldOutReport(
        loso=loso_rel,
        loso_sources=group_figures(
            [data.groups[i] for i in ext], y[ext], loso.scores[ext], loso_rel.op_threshold
        ),
        loso_languages=group_figures(
            [language_of(data.records[i]) for i in ext],
            y[ext],
            loso.scores[ext],
            loso_rel.op_threshold,
        ),
        cues=_cue_figures(loso, loso_rel.op_threshold),
        lofo=lofo_rel,
        lofo_families=group_figures(
            [data.groups[i] for i in fam], y[fam], lofo.scores[fam], lofo_rel.op_threshold
        ),
        settings={
            "C": settings.c,
            "external_weight": settings.external_weight,
            "external_hashed": settings.external_hashed,
            "calibration_external_weight": settings.calibration_external_weight,
        },
    )


def _rel_lines(title: str, r: Reliability) -> list[str]:
    return [
        f"{title}: {r.n} prompts ({r.n_complex} complex)",
        f"  ROC AUC {r.roc_auc:.4f}; catching 95 % of complex sends {r.simple_sent_at_95:.1%} "
        f"of simple to precise (threshold {r.op_threshold:.4f})",
        f"  Brier {r.brier:.4f}, ECE {r.ece:.4f}; at p >= 0.5: complex caught "
        f"{r.caught_at_half:.1%}, simple sent {r.simple_sent_at_half:.1%}",
    ]


def group_lines(title: str, rows: Sequence[GroupFigures]) -> list[str]:
    """A table of per-group figures (source, language, family), one line per group."""
    lines = [
        title,
        f"  {'name':<26}{'n':>6}{'complex':>9}{'mean p':>8}{'auc':>7}{'sent@op':>9}{'sent@0.5':>9}",
    ]
    for g in rows:
        auc = f"{g.roc_auc:.3f}" if g.roc_auc is not None else "-"
        lines.append(
            f"  {g.name[:25]:<26}{g.n:>6}{g.n_complex:>9}{g.mean_score:>8.3f}"
            f"{auc:>7}{g.sent_at_op:>9.3f}{g.sent_at_half:>9.3f}"
        )
    return lines


def render_held_out(report: HeldOutReport) -> str:
    """Human-readable held-out report."""
    lines = _rel_lines("leave-one-source-out (external sources)", report.loso)
    lines += [
        "",
        *group_lines("LOSO by source (sent@op: share sent at the 95 % point)", report.loso_sources),
    ]
    lines += ["", *group_lines("LOSO by language", report.loso_languages)]
    lines += ["", "cue checks on the LOSO models (score of the same rows, cue changed)"]
    for c in report.cues:
        lines.append(
            f"  {c.name}: n={c.n}, mean {c.mean_before:.3f} -> {c.mean_after:.3f}, "
            f"sent@op {c.sent_at_op_before:.3f} -> {c.sent_at_op_after:.3f}, "
            f"largest change {c.max_abs_change:.3f}"
        )
    lines += ["", *_rel_lines("leave-one-family-out (our corpus)", report.lofo)]
    lines += ["", *group_lines("LOFO by family", report.lofo_families)]
    return "\n".join(lines)
