"""Write router round 17's candidate rows (docs/router.md): the ``exam_choice`` family at one
round seed, as corpus records that continue the committed corpus's ids.

Usage: ``.venv/bin/python bench/classify/round17_rows.py SEED OUT`` (SEED 0 or 1; the family's
``Random`` is ``DEFAULT_SEED + 1701 + SEED``). The round measured ``/tmp/r17/exam-seed{0,1}.jsonl``
written this way; the files were not committed, this command rebuilds them byte for byte.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from random import Random
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router_models.corpus import exam_choice  # noqa: E402
from router_models.corpus.build import (  # noqa: E402
    DEFAULT_CORPUS,
    DEFAULT_SEED,
    SOURCE,
    Recipe,
    _recipe_records,
    write,
)
from router_models.records import read_jsonl  # noqa: E402

EXAM_SEED_OFFSET = 1701
EXAM = tuple(
    Recipe(
        "exam_choice",
        label,
        120,
        (partial(exam_choice.question, language=language, kind=kind),),
        noise=language == "en",
    )
    for label, kind in (("simple", "recall"), ("complex", "calculation"))
    for language in exam_choice.LANGUAGES
)


def rows(round_seed: int) -> list[dict[str, Any]]:
    """The 720 candidate records at ``round_seed``, ids after the committed corpus's."""
    start = len(read_jsonl(DEFAULT_CORPUS))
    rng = Random(DEFAULT_SEED + EXAM_SEED_OFFSET + round_seed)
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    for recipe in EXAM:
        records.extend(_recipe_records(rng, recipe, seen))
    return [
        {"id": f"gen-{start + i:05d}", "source": SOURCE, **record}
        for i, record in enumerate(records)
    ]


def main(argv: list[str]) -> int:
    """Write the rows of round seed ``argv[0]`` to ``argv[1]``."""
    records = rows(int(argv[0]))
    write(records, Path(argv[1]))
    print(f"wrote {len(records)} records to {argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
