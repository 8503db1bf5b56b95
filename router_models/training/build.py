"""Rebuild ``router_models/training/data/external-train.jsonl`` from fetched source copies.

::

    # fetch each repository of sources.PINS (the fetch tool puts it at
    # <mirror-root>/<owner>+<name>/repo), generate the DeepMind questions (gen_mathematics.py),
    python -m router_models.training.build --mirror-root /work/.mirror --dm-mathematics dm.jsonl
    python -m router_models.training.build ... --stats      # counts only, nothing written
    python -m router_models.training.build --only followbench --out .../followbench.jsonl

Each source's rows are labelled by ``rules.py``, then at most ``CAPS[source]`` rows per label
are kept, chosen by the sha1 of the row id (same input, same bytes).  Prompts that repeat
(lower-cased, whitespace collapsed), within or across sources, are kept once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, TextIO

from router_models.training.sources import PINS, READERS, Repo, Row, dm_mathematics

OUT: Final = Path(__file__).resolve().parent / "data" / "external-train.jsonl"
# Rows kept per source and label.  Caps keep any one source (and its packaging) from
# dominating the fit; the balance within a source is what teaches the task.
CAPS: Final = {
    "jmmlu": 800,
    "tal_scq5k": 600,
    "ape210k": 900,
    "aqua": 400,
    "svamp": 400,
    "dm_mathematics": 400,
    "followbench": 200,
    "stepgame": 400,
    "multi_logieval": 400,
}
# Sources built into their own files (``--only followbench --out ...``), not
# external-train.jsonl.
SEPARATE: Final = frozenset(("followbench", "stepgame", "multi_logieval"))
MAX_CHARS: Final = 8000


def _key(row: Row) -> str:
    return hashlib.sha1(row.id.encode("utf-8")).hexdigest()  # noqa: S324 - a sample order


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def sample(rows: Iterable[Row], cap: int, seen: set[str]) -> list[Row]:
    """At most ``cap`` rows per label, in sha1 order of their ids, skipping repeats."""
    by_label: dict[str, list[Row]] = {}
    for row in sorted(rows, key=_key):
        norm = _norm(row.prompt)
        kept = by_label.setdefault(row.label, [])
        if norm in seen or len(row.prompt) > MAX_CHARS or len(kept) >= cap:
            continue
        seen.add(norm)
        kept.append(row)
    return sorted((r for rows_ in by_label.values() for r in rows_), key=lambda r: r.id)


def collect(
    mirror_root: Path, dm_lines: Sequence[str] | None, only: Sequence[str] = ()
) -> list[Row]:
    """Every source's sampled rows (those of ``only`` when given; otherwise all but the
    ``SEPARATE`` ones); a source whose repository is missing is skipped (said)."""
    seen: set[str] = set()
    out: list[Row] = []
    for name, reader in READERS.items():
        if (name not in only) if only else (name in SEPARATE):
            continue
        pin = PINS[name]
        git_dir = mirror_root / pin.repo.replace("/", "+") / "repo"
        if not git_dir.is_dir():
            sys.stderr.write(f"skip {name}: no fetched copy at {git_dir}\n")
            continue
        out += sample(reader(Repo(git_dir, pin.commit)), CAPS[name], seen)
    if only and "dm_mathematics" not in only:
        return out
    if dm_lines is None:
        sys.stderr.write("skip dm_mathematics: give --dm-mathematics FILE\n")
    else:
        out += sample(dm_mathematics(dm_lines), CAPS["dm_mathematics"], seen)
    return out


def language(row: Row) -> str:
    """The language tag a builder put at the end of ``category``."""
    return row.category.rsplit("/", 1)[-1]


def stats(rows: Sequence[Row], out: TextIO) -> None:
    """Counts per source, label and language (the data cards quote this table)."""
    table = Counter((r.source, r.label, language(r)) for r in rows)
    out.write(f"{'source':<16}{'lang':<6}{'simple':>8}{'complex':>9}\n")
    for source, lang in sorted({(s, g) for s, _, g in table}):
        out.write(
            f"{source:<16}{lang:<6}{table[(source, 'simple', lang)]:>8}"
            f"{table[(source, 'complex', lang)]:>9}\n"
        )
    cjk = sum(1 for r in rows if language(r) in {"zh", "ja"})
    simple = sum(1 for r in rows if r.label == "simple")
    out.write(
        f"total {len(rows)} ({simple} simple, {len(rows) - simple} complex); "
        f"Chinese or Japanese {cjk} ({cjk / max(1, len(rows)):.1%})\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or with ``--stats`` only count) the external training file."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mirror-root", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--dm-mathematics", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stats", action="store_true")
    parser.add_argument("--only", action="append", default=[], help="build only this source")
    args = parser.parse_args(argv)
    dm = (
        args.dm_mathematics.read_text(encoding="utf-8").splitlines()
        if args.dm_mathematics
        else None
    )
    rows = collect(args.mirror_root, dm, args.only)
    stats(rows, sys.stdout)
    if not args.stats:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row.as_record(), ensure_ascii=False) + "\n")
        digest = hashlib.md5(args.out.read_bytes()).hexdigest()  # noqa: S324 - a checksum
        sys.stdout.write(f"wrote {args.out} (md5 {digest})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
