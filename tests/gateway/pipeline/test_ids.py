"""Request ids: valid version-4 UUIDs, distinct, and distinct between forked workers."""

from __future__ import annotations

import multiprocessing
import uuid

from gateway.pipeline.context import request_id_from
from gateway.pipeline.ids import fresh_id


def test_fresh_ids_are_version_4_uuids_and_distinct() -> None:
    """Backends that accept only UUIDs (llama.cpp) take them; 10,000 never repeat."""
    ids = [fresh_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:1000]:
        parsed = uuid.UUID(value)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert parsed.hex == value


def _child_id(queue: multiprocessing.Queue[str]) -> None:
    queue.put(fresh_id())


def test_forked_workers_do_not_share_the_id_sequence() -> None:
    """``tiergate serve --workers N`` forks: a child's ids must not replay its parent's."""
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = ctx.Queue()
    children = [ctx.Process(target=_child_id, args=(queue,)) for _ in range(3)]
    for child in children:
        child.start()
    got = {queue.get(timeout=30) for _ in children}
    for child in children:
        child.join(timeout=30)
    mine = {fresh_id() for _ in range(3)}
    assert len(got) == 3
    assert not got & mine


def test_sane_caller_ids_are_kept_and_others_replaced_by_a_fresh_uuid() -> None:
    """A sane caller id is echoed (backends get a fresh UUID per attempt, see forwarding)."""
    assert request_id_from("req-42") == "req-42"
    made = request_id_from("bad\nid")
    assert uuid.UUID(made).version == 4
