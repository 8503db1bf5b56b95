"""Tests for bench/classify/run.py: the latency benchmark scores real external prompts."""

from __future__ import annotations

import pytest

from bench.classify.run import typical_bodies
from router_models.features import render
from router_models.train import DEV2


@pytest.mark.skipif(not DEV2.is_file(), reason="router-dev2.jsonl is not beside the repository")
def test_benchmark_prompts_are_real_1kb_prompts_from_router_dev2() -> None:
    """Every benchmark body comes from router-dev2 and renders to 800-1,300 UTF-8 bytes."""
    origin, bodies = typical_bodies()
    assert origin == "router-dev2.jsonl"
    assert len(bodies) >= 200
    for body in bodies:
        assert 800 <= len(render(body).text.encode("utf-8")) <= 1300
