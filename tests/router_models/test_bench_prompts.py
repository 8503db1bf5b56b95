"""Tests for bench/classify/run.py: the latency benchmark scores real external 1 KB prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.classify.run import typical_bodies
from router_models.features import render
from router_models.records import read_jsonl
from router_models.training import EXTERNAL_TRAIN
from router_models.training.train import DEV2


def _about_1kb(bodies: list[dict[str, object]]) -> bool:
    return all(800 <= len(render(b).text.encode("utf-8")) <= 1300 for b in bodies)


@pytest.mark.skipif(not DEV2.is_file(), reason="router-dev2.jsonl is not beside the repository")
def test_benchmark_prompts_come_from_router_dev2_when_it_is_there() -> None:
    """With ../shared present, every benchmark body is a 1 KB router-dev2 prompt."""
    origin, bodies = typical_bodies()
    assert origin == "router-dev2.jsonl"
    assert len(bodies) >= 200
    assert _about_1kb(bodies)


def test_benchmark_falls_back_to_the_committed_external_file(tmp_path: Path) -> None:
    """Without router-dev2 the committed public-source file is used, never the corpus."""
    origin, bodies = typical_bodies(sources=(tmp_path / "absent.jsonl", EXTERNAL_TRAIN))
    assert origin == "external-train.jsonl"
    assert len(bodies) >= 40
    assert _about_1kb(bodies)
    external = {r["prompt"] for r in read_jsonl(EXTERNAL_TRAIN)}
    assert all(b["prompt"] in external for b in bodies)
