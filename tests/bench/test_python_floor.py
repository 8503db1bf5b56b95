"""The Python floor leg proxies the benchmark's request to the fixed upstream, and only that."""

from __future__ import annotations

import json
from pathlib import Path

from bench.harness.legs import Placement, start_fixed_upstream
from bench.harness.processes import post_json
from bench.overhead.peers import start_python_floor

NO_PIN = Placement.build(pin=False, boost=False)


def test_the_floor_forwards_posts_with_the_upstream_model_and_keeps_connections(
    tmp_path: Path,
) -> None:
    """Chat completions come back as the upstream answered them (the leg's probe passed too),
    several in a row over the floor's kept-alive backend connection."""
    upstream = start_fixed_upstream(tmp_path, NO_PIN)
    try:
        floor = start_python_floor(upstream, tmp_path, NO_PIN)
        try:
            body = json.dumps(floor.body()).encode()
            for _ in range(3):
                status, answer = post_json(floor.chat_url, body, None)
                assert status == 200
                assert json.loads(answer)["object"] == "chat.completion"
            assert floor.name.startswith("Python floor")
        finally:
            floor.stop()
    finally:
        upstream.stop()
