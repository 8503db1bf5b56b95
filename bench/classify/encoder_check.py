"""Does a pretrained encoder pay for its latency?  Issue 35, item 5.

The only registry package found whose wheel ships encoder weights with a documented licence is
``wordllama`` 0.4.0.post1 (MIT code; ``wordllama/weights/l2_supercat_256.safetensors``, a
32,000 x 256 float16 static token-embedding table, with the LLaMA-2 tokenizer in
``wordllama/tokenizers/``).  It is *not* a dependency of the gateway.  Install it into the
experiment's virtual environment only (``make install-dev`` removes it again)::

    .tools/bin/uv pip install --python .venv/bin/python wordllama==0.4.0.post1

The weights and the tokenizer are read straight from the installed package (no hub access:
``WordLlama.load()`` would try huggingface.co for the tokenizer and fail offline).  A prompt's
embedding is WordLlama's own: the mean of its tokens' rows (no special tokens), L2-normalised.
The embedded text is ``features.render(body).text``, the text the shipped scorer reads.

Model configurations, fixed before any leave-one-source-out figure was seen (and not changed
after; router-dev.jsonl is never read):

* ``features``: the shipped features and settings (C = 4), at ``--external-weight``.
* ``encoder``: the embedding alone; each dimension standardised with the mean and standard
  deviation of the *corpus* rows (the corpus is in the training side of every fold, so no
  held-out source's inputs shape the scaling); the same liblinear fitter at C = 1
  (scikit-learn's default: no tuning).
* ``features+encoder``: the shipped feature vector with the standardised embedding appended,
  scaled by 1/sqrt(256) so the block's squared norm per row is about 1 (the order of the
  hashed block's, whose counts are scaled by 1/sqrt(tokens)); C = 4 (the shipped value).

Every configuration goes through ``honest.loso_scores``: per-fold Platt calibration on
group-held-out margins, every external source held out in turn.

Usage (run under ``nice -n 19``; one configuration per process, then ``--combine``)::

    nice -n 19 .venv/bin/python bench/classify/encoder_check.py loso --config features \\
        --out /tmp/enc-runs --data router_models/corpus/tiergate-corpus.jsonl \\
        router_models/corpus/hard-cases.jsonl router_models/training/data/external-train.jsonl \\
        router_models/training/data/followbench.jsonl ../shared/datasets/router-dev2.jsonl
    (the same with --config encoder and --config features+encoder; the committed report,
    encoder-check.md, added --keep-one-in 2: a deterministic half of the rows)
    .venv/bin/python bench/classify/encoder_check.py combine --out /tmp/enc-runs
    .venv/bin/python bench/classify/encoder_check.py latency --rounds 20 --out /tmp/enc-runs
    .venv/bin/python bench/classify/encoder_check.py tokens --out /tmp/enc-runs \\
        --data router_models/training/data/external-train.jsonl ../shared/datasets/router-dev2.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import sparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import router_models  # noqa: E402
from bench.classify.run import summary, timed, typical_bodies  # noqa: E402
from router_models.artifact import FloatArray  # noqa: E402
from router_models.features import render  # noqa: E402
from router_models.records import body_of, read_jsonl  # noqa: E402
from router_models.training.crossval import BoolArray, trainable  # noqa: E402
from router_models.training.evaluate import roc_auc  # noqa: E402
from router_models.training.honest import language_of, loso_scores, reliability  # noqa: E402
from router_models.training.train import Prepared, TrainSettings, prepare  # noqa: E402

CONFIGS: Final = {"features": 4.0, "encoder": 1.0, "features+encoder": 4.0}
CJK: Final = frozenset(("zh", "ja"))
WEIGHTS: Final = "weights/l2_supercat_256.safetensors"
TOKENIZER: Final = "tokenizers/l2_supercat_tokenizer_config.json"


class Encoder:
    """WordLlama's default static embedding, loaded from the installed wheel's files."""

    def __init__(self) -> None:
        package = Path(str(importlib.import_module("wordllama").__file__)).parent
        tokenizers: Any = importlib.import_module("tokenizers")
        safetensors: Any = importlib.import_module("safetensors")
        self.tokenizer: Any = tokenizers.Tokenizer.from_file(str(package / TOKENIZER))
        with safetensors.safe_open(str(package / WEIGHTS), framework="np") as f:
            table = f.get_tensor("embedding.weight")
        self.table: FloatArray = np.ascontiguousarray(table, dtype=np.float32)
        self.weights_bytes = (package / WEIGHTS).stat().st_size

    def pool(self, ids: Sequence[int]) -> FloatArray:
        """L2-normalised mean of the rows of ``ids`` (zeros for an empty text)."""
        if not ids:
            return np.zeros(self.table.shape[1], dtype=np.float32)
        mean = self.table[np.asarray(ids, dtype=np.intp)].mean(axis=0)
        norm = float(np.linalg.norm(mean))
        return np.asarray(mean / norm if norm > 0 else mean, dtype=np.float32)

    def embed(self, text: str) -> FloatArray:
        """The embedding of one text, as the request path would compute it."""
        return self.pool(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def embed_many(self, texts: Sequence[str], chunk: int = 512) -> FloatArray:
        """One row per text (batched tokenisation; same vectors as ``embed``)."""
        rows: list[FloatArray] = []
        for start in range(0, len(texts), chunk):
            batch = self.tokenizer.encode_batch(
                list(texts[start : start + chunk]), add_special_tokens=False
            )
            rows.extend(self.pool(enc.ids) for enc in batch)
        return np.vstack(rows).astype(np.float64)


def embedding_block(emb: FloatArray, corpus: BoolArray, scale: float) -> sparse.csr_matrix:
    """``emb`` standardised with the corpus rows' statistics, times ``scale``, as CSR."""
    mean = emb[corpus].mean(axis=0)
    std = emb[corpus].std(axis=0)
    std[std == 0] = 1.0
    return sparse.csr_matrix((emb - mean) / std * scale)


def variant(data: Prepared, config: str, encoder: Encoder | None) -> Prepared:
    """``data`` with the feature matrix of ``config``."""
    if config == "features":
        return data
    if encoder is None:
        raise ValueError(f"{config} needs the encoder")
    emb = encoder.embed_many([render(body_of(r)).text for r in data.records])
    corpus = np.array([g.startswith("corpus/") for g in data.groups], dtype=np.bool_)
    if config == "encoder":
        x = embedding_block(emb, corpus, 1.0)
    else:
        block = embedding_block(emb, corpus, 1.0 / np.sqrt(emb.shape[1]))
        x = sparse.csr_matrix(sparse.hstack([data.x, block], format="csr"))
    return dataclasses.replace(data, x=x, x_fit=x)


def subsample(records: Sequence[dict[str, Any]], keep_one_in: int) -> list[dict[str, Any]]:
    """The records whose CRC-32 (of their sorted-key JSON) is 0 modulo ``keep_one_in``: a
    deterministic, label- and source-blind subsample (all of them at 1)."""
    return [
        r
        for r in records
        if zlib.crc32(json.dumps(r, sort_keys=True).encode("utf-8")) % keep_one_in == 0
    ]


def run_loso(paths: Sequence[Path], config: str, weight: float, out: Path, keep: int) -> None:
    """Leave-one-source-out scores of ``config``, saved with the rows' labels and groups."""
    settings = dataclasses.replace(TrainSettings(), external_weight=weight, c=CONFIGS[config])
    data = prepare(subsample([r for p in paths for r in read_jsonl(p)], keep), settings)
    encoder = None if config == "features" else Encoder()
    start = time.perf_counter()
    scores = loso_scores(variant(data, config, encoder), settings)
    rows = np.flatnonzero(~np.isnan(scores))
    result = {
        "config": config,
        "C": settings.c,
        "external_weight": weight,
        "keep_one_in": keep,
        "data": [str(p) for p in paths],
        "seconds": round(time.perf_counter() - start, 1),
        "score": scores[rows].tolist(),
        "y": data.y[rows].astype(int).tolist(),
        "group": [data.groups[i] for i in rows],
        "lang": [language_of(data.records[i]) for i in rows],
        "trainable": [trainable(data.records[i]) for i in rows],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"loso-{config}.json").write_text(json.dumps(result), encoding="utf-8")


def _pooled_row(name: str, res: dict[str, Any]) -> str:
    y = np.asarray(res["y"], dtype=np.int_)
    p = np.asarray(res["score"], dtype=np.float64)
    cjk = np.array([lang in CJK for lang in res["lang"]], dtype=np.bool_)
    train = np.asarray(res["trainable"], dtype=np.bool_)
    every, zhja = reliability(y, p), reliability(y[cjk], p[cjk])
    only = reliability(y[train], p[train])
    return (
        f"| {name} (C = {res['C']:g}) | {every.roc_auc:.4f} | {every.simple_sent_at_95:.1%} | "
        f"{every.ece:.4f} | {only.roc_auc:.4f} | {roc_auc(y[~cjk], p[~cjk]):.4f} | "
        f"{zhja.roc_auc:.4f} | {zhja.simple_sent_at_95:.1%} | {res['seconds']:.0f} |"
    )


def _source_rows(results: Sequence[dict[str, Any]]) -> list[str]:
    header = "| source | n | complex | " + " | ".join(r["config"] for r in results) + " |"
    lines = [header, "|---|---:|---:|" + "---:|" * len(results)]
    groups = results[0]["group"]
    for name in sorted(set(groups)):
        idx = [i for i, g in enumerate(groups) if g == name]
        y = np.asarray(results[0]["y"], dtype=np.int_)[idx]
        if not 0 < y.sum() < y.size:
            continue
        aucs = [roc_auc(y, np.asarray(r["score"], dtype=np.float64)[idx]) for r in results]
        lines.append(
            f"| {name} | {y.size} | {int(y.sum())} | " + " | ".join(f"{a:.3f}" for a in aucs) + " |"
        )
    return lines


def _paired_delta(base: dict[str, Any], other: dict[str, Any], draws: int = 1000) -> str:
    """Pooled AUC of ``other`` minus ``base`` with a paired bootstrap 95 % interval (rows
    resampled with replacement, seed 0)."""
    y = np.asarray(base["y"], dtype=np.int_)
    a = np.asarray(base["score"], dtype=np.float64)
    b = np.asarray(other["score"], dtype=np.float64)
    rng = np.random.default_rng(0)
    deltas = []
    for _ in range(draws):
        idx = rng.integers(0, y.size, y.size)
        deltas.append(roc_auc(y[idx], b[idx]) - roc_auc(y[idx], a[idx]))
    low, high = np.quantile(deltas, [0.025, 0.975])
    return (
        f"- {other['config']} minus {base['config']}: pooled AUC "
        f"{roc_auc(y, b) - roc_auc(y, a):+.4f} (paired bootstrap 95 % interval "
        f"{low:+.4f} to {high:+.4f}, {draws} draws)"
    )


def combine(out: Path) -> str:
    """The Markdown tables of every saved configuration, side by side."""
    results = [
        json.loads((out / f"loso-{c}.json").read_text(encoding="utf-8"))
        for c in CONFIGS
        if (out / f"loso-{c}.json").is_file()
    ]
    lines = [
        f"external weight {results[0]['external_weight']}; one row in "
        f"{results[0]['keep_one_in']} kept (CRC-32 of the record); data: "
        + ", ".join(results[0]["data"]),
        "",
        "| configuration | pooled AUC | simple sent at 95 % caught | ECE | trainable-sources "
        "AUC | non-CJK AUC | zh+ja AUC | zh+ja simple sent | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_pooled_row(r["config"], r) for r in results),
        "",
        *(_paired_delta(results[0], r) for r in results[1:]),
        "",
        "Per held-out source with both labels (ROC AUC):",
        "",
        *_source_rows(results),
    ]
    return "\n".join(lines)


def coverage(paths: Sequence[Path]) -> str:
    """How the encoder's tokenizer cuts the zh, ja and en prompts of ``paths``."""
    encoder = Encoder()
    seen: dict[str, list[int]] = {lang: [0, 0, 0, 0] for lang in ("zh", "ja", "en")}
    for record in (r for p in paths for r in read_jsonl(p)):
        counts = seen.get(language_of(record))
        if counts is None:
            continue
        text = render(body_of(record)).text
        tokens = encoder.tokenizer.encode(text, add_special_tokens=False).tokens
        counts[0] += 1
        counts[1] += len(tokens)
        counts[2] += sum(t.startswith("<0x") for t in tokens)
        counts[3] += len(text.encode("utf-8"))
    lines = [
        "| language | prompts | tokens per prompt | pieces that are raw UTF-8 bytes "
        "| UTF-8 bytes per token |",
        "|---|---:|---:|---:|---:|",
    ]
    for lang, (n, tokens, raw, size) in seen.items():
        if n:
            lines.append(
                f"| {lang} | {n:,} | {tokens / n:.0f} | {raw / tokens:.1%} | {size / tokens:.2f} |"
            )
    return "\n".join(lines)


def latency(rounds: int) -> str:
    """p50/p99 of the shipped scorer, the encoder, and both, on the same ~1 KB real prompts."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    origin, bodies = typical_bodies()
    router = router_models.load()
    encoder = Encoder()
    weights = np.random.default_rng(0).standard_normal(encoder.table.shape[1])

    def encode(body: dict[str, Any]) -> float:
        return float(encoder.embed(render(body).text) @ weights)

    def both(body: dict[str, Any]) -> float:
        return router.score(body) + encode(body)

    def tokenise(body: dict[str, Any]) -> int:
        return len(encoder.tokenizer.encode(render(body).text, add_special_tokens=False).ids)

    variants = {
        "shipped scorer (warm cache)": router.score,
        "encoder's tokeniser alone (render + encode)": tokenise,
        "encoder: render + tokenise + mean-pool + 256-d dot": encode,
        "shipped scorer + encoder (what features+encoder would cost)": both,
    }
    lines = [
        f"{len(bodies)} prompts of 800-1,300 UTF-8 bytes from {origin}, {rounds} rounds, "
        f"pinned to CPU 0, 1-minute load average {os.getloadavg()[0]:.1f}; "
        f"encoder weights {encoder.weights_bytes / 1e6:.1f} MB (float16 on disk, "
        f"{encoder.table.nbytes / 1e6:.1f} MB as float32 in memory)",
        "",
        "| variant | p50 µs | p90 µs | p99 µs | mean µs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, fn in variants.items():
        s = summary(timed(fn, bodies, rounds))
        lines.append(
            f"| {name} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {s['mean']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``loso`` (one configuration), ``combine`` (the tables), ``latency`` or ``tokens``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("loso", "combine", "latency", "tokens"))
    parser.add_argument("--config", choices=tuple(CONFIGS), default="features")
    parser.add_argument("--data", type=Path, nargs="+", default=[])
    parser.add_argument("--external-weight", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--keep-one-in", type=int, default=1, help="deterministic subsample")
    args = parser.parse_args(argv)
    if args.mode == "loso":
        run_loso(args.data, args.config, args.external_weight, args.out, args.keep_one_in)
        return 0
    if args.mode == "tokens":
        text = coverage(args.data)
    else:
        text = combine(args.out) if args.mode == "combine" else latency(args.rounds)
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
