"""Attacks on shadow evaluation: the shadow resends a body checked for one tier to the other."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess
from tests.stack import Backends, Stack, running_stack

pytestmark = pytest.mark.slow
PUBLIC = "http://93.184.215.14/cat.png"
FAST_CAP = 32


def _shadow_everything(config: dict[str, Any], _backends: Backends) -> None:
    config["tiers"]["fast"]["allow_remote_media"] = True
    config["tiers"]["fast"]["max_tokens_cap"] = FAST_CAP
    config["router"] = {"shadow": {"fast_ratio": 1.0, "precise_ratio": 1.0, "max_waiting": 1000}}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Fast allows remote media and caps max_tokens at 32; precise is inline only, cap 4096."""
    with running_stack(configure=_shadow_everything) as stack:
        yield stack


def wait_for_request(sim: SimulatorProcess, before: int) -> dict[str, Any]:
    """The body of the next request ``sim`` receives after ``before`` (the shadow's)."""
    deadline = time.monotonic() + patience(5)
    while time.monotonic() < deadline:
        stats = sim.stats()
        if stats["requests_total"] > before:
            return dict(stats["last_request"])
        time.sleep(0.05)
    return {}


def test_a_shadow_does_not_send_remote_media_to_a_tier_that_forbids_it(stack: Stack) -> None:
    """A URL allowed on fast must not reach precise (inline media only) through the shadow."""
    before = stack.precise.stats()["requests_total"]
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": PUBLIC}},
    ]
    resp = stack.post(
        {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}
    )
    assert resp.status_code == 200, resp.text
    seen = wait_for_request(stack.precise, before)
    assert PUBLIC not in str(seen), "the shadow handed precise a URL it forbids"


def test_a_shadow_respects_the_target_tier_max_tokens_cap(stack: Stack) -> None:
    """A precise request with max_tokens 2000 is shadowed on fast (cap 32) above its cap."""
    before = stack.fast.stats()["requests_total"]
    resp = stack.post(
        {
            "model": "precise",
            "max_tokens": 2000,
            "messages": [{"role": "user", "content": "write a long story"}],
        }
    )
    assert resp.status_code == 200, resp.text
    seen = wait_for_request(stack.fast, before)
    assert seen, "no shadow reached fast"
    asked = max(int(seen.get("max_tokens") or 0), int(seen.get("max_completion_tokens") or 0))
    assert asked <= FAST_CAP, f"the shadow asked fast for {asked} tokens (cap {FAST_CAP})"


def test_a_shadow_never_sends_a_prompt_to_a_tier_the_key_may_not_use(
    tmp_path: Path,
) -> None:
    """A fast-only key's prompts stay off precise: allowed_tiers binds shadows too."""
    path = tmp_path / "keys.yaml"
    record, key = issue_key("t", KeyPolicy(allowed_tiers=frozenset({"fast"})), now=time.time())
    FileKeyStore(path).put_sync(record)

    def fast_only_key(config: dict[str, Any], _backends: Backends) -> None:
        config["auth"] = {"keys_file": str(path)}
        config["router"] = {"shadow": {"fast_ratio": 1.0, "max_waiting": 1000}}

    with running_stack(configure=fast_only_key) as stack:
        body = {
            "model": "fast",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "confidential: fast tier only"}],
        }
        resp = stack.post(body, key=key)
        assert resp.status_code == 200, resp.text
        seen = wait_for_request(stack.precise, 0)
    assert not seen, "a fast-only key's prompt was sent to precise by a shadow"
