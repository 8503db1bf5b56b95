"""Shadow records and their bounded store (``router.shadow.store``).

A record is one shadow's outcome: direction, tiers, route score, agreement, a digest of the
prompt and the router's hashed feature vector of the request — what ``tiergate router train
--from-shadow`` learns from — but no answer text, and no prompt text unless
``store_prompts`` is on. The store is a JSON-lines file rotated in two halves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ShadowRecord:
    """One shadow outcome: no answer text, and no prompt text unless ``store_prompts`` is on.

    ``features`` is the router's hashed feature vector of the request (``index``/``value``
    lists, what ``tiergate router train --from-shadow`` learns from), ``feature_space`` the
    space it lives in (a record of another space is stale) and ``artifact`` the id of the
    artifact that computed ``score``. ``tenant`` is the caller's tenant (the key's owner, never
    the key): training weighs tenants by it. Records written before it existed have none and
    are read as tenant unknown.
    """

    at: float
    direction: str
    tier: str
    shadow_tier: str
    score: float | None
    agreement: float
    method: str
    prompt_digest: str
    feature_space: str | None = None
    artifact: str | None = None
    features: dict[str, list[Any]] | None = None
    prompt: str | None = None
    judge: float | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a record learns about its request from the router (``Featurizer``'s answer)."""

    feature_space: str
    artifact: str | None
    index: list[int]
    value: list[float]


# The live router's features of a request body; None when the classifier has none.
Featurizer = Callable[[Mapping[str, Any]], RequestFeatures | None]


class ShadowStore:
    """A bounded JSON-lines file of shadow records, rotated in two halves.

    ``path`` takes new records; when it holds ``max_records // 2`` it is renamed to
    ``path.1`` (replacing the older half) and a new ``path`` begins. The two files together
    hold at most ``max_records`` records, newest last, and a rotation is one rename (never a
    rewrite of a large file on the event loop). ``files()`` lists them oldest first.
    """

    def __init__(self, path: Path, max_records: int) -> None:
        self.path = path
        self.half = max(1, max_records // 2)
        self.count = 0
        if path.exists():
            with path.open("rb") as existing:
                self.count = sum(1 for _ in existing)

    def files(self) -> list[Path]:
        """The store's files that exist, oldest records first."""
        return [p for p in (rotated(self.path), self.path) if p.exists()]

    def append(self, record: ShadowRecord) -> None:
        """Add one record (a local file write of one line; small enough for the loop)."""
        if self.count >= self.half:
            self.path.replace(rotated(self.path))
            self.count = 0
        line = json.dumps(asdict(record))
        with self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        self.count += 1


def rotated(path: Path) -> Path:
    """Where the store's older half lives: ``path`` with ``.1`` appended."""
    return path.with_name(path.name + ".1")
