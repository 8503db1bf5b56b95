"""The bounded shadow store: two halves, one rename per rotation, newest records kept."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.routing.shadow_store import ShadowRecord, ShadowStore, rotated


def record(i: int) -> ShadowRecord:
    """A record whose score says which one it was."""
    return ShadowRecord(0.0, "fast_on_precise", "fast", "precise", i / 230, 1.0, "exact", "d")


def test_the_store_rotates_in_halves(tmp_path: Path) -> None:
    """At most max_records lines in the two files; the newest are in ``store``."""
    store = tmp_path / "s.jsonl"
    writer = ShadowStore(store, 100)
    for i in range(230):
        writer.append(record(i))
    lines = rotated(store).read_text().splitlines() + store.read_text().splitlines()
    assert len(lines) == 80  # 230 = 4 full halves of 50, then 30 in the current file
    assert [json.loads(x)["score"] for x in lines][-1] == 229 / 230
    assert ShadowStore(store, 100).files() == [rotated(store), store]
    assert ShadowStore(store, 100).count == 30
