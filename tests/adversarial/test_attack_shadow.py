"""Attacks on shadow evaluation: the shadow resends a body checked for one tier to the other.

One gateway for the module. A test that says a shadow must *not* reach a tier does not wait
out a time limit for it: after the request under test it sends a probe (text only, by a key
that may use both tiers) whose shadow does reach that tier, and waits until the gateway has
finished every shadow it started (the probe's among them). The shadow of the request under
test would be submitted as its answer is written out, once its limits are settled: before the
probe's own request can have been served and shadowed, so by then it was either sent or never
made: the tier must have received the probe's shadow alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.forked_gateway import ForkedGateway
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess
from tests.stack import Backends, Stack, running_stack

pytestmark = pytest.mark.slow
PUBLIC = "http://93.184.215.14/cat.png"
FAST_CAP = 32
ADMIN = "attack-shadow-admin-token-000000000000"
PROBE = "probe: name a colour"


@dataclass(frozen=True)
class Keys:
    """A key that may use both tiers, and one that may use fast only."""

    full: str
    fast_only: str


@dataclass(frozen=True)
class World:
    """The module's gateway and its keys."""

    stack: Stack
    keys: Keys


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Fast allows remote media and caps max_tokens at 32; precise is inline only, cap 4096.
    Every request a key may have shadowed is shadowed, both ways."""
    path = tmp_path_factory.mktemp("attack-shadow") / "keys.yaml"
    now = time.time()
    full_record, full = issue_key("t-full", KeyPolicy(), now=now)
    fast_record, fast_only = issue_key(
        "t-fast", KeyPolicy(allowed_tiers=frozenset({"fast"})), now=now
    )
    store = FileKeyStore(path)
    store.put_sync(full_record)
    store.put_sync(fast_record)

    def configure(config: dict[str, Any], _backends: Backends) -> None:
        config["auth"] = {"keys_file": str(path), "admin_token": ADMIN}
        config["tiers"]["fast"]["allow_remote_media"] = True
        config["tiers"]["fast"]["max_tokens_cap"] = FAST_CAP
        config["router"] = {
            "shadow": {"fast_ratio": 1.0, "precise_ratio": 1.0, "max_waiting": 1000}
        }

    # Forked (tests/integration/forked_gateway.py): these tests are not about start-up.
    with running_stack(configure=configure, gateway_type=ForkedGateway) as stack:
        yield World(stack, Keys(full, fast_only))


def shadows(stack: Stack) -> tuple[int, int]:
    """(shadows running, shadows finished any way) on ``/admin/routing``."""
    view = httpx.get(
        stack.gateway.url + "/admin/routing",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    ).json()["shadow"]
    outcomes: dict[str, int] = view["outcomes"]
    done = sum(n for name, n in outcomes.items() if not name.startswith("judge:"))
    return int(view["running"]), done


def settled(stack: Stack, finished: int = -1) -> int:
    """Wait until more than ``finished`` shadows have finished and none is running; how many
    have finished."""
    deadline = time.monotonic() + patience(10)
    while time.monotonic() < deadline:
        running, done = shadows(stack)
        if not running and done > finished:
            return done
        time.sleep(0.05)
    pytest.fail(f"the gateway's shadows never settled: {shadows(stack)}")


def only_the_probe_reached(world: World, sim: SimulatorProcess, before: int, done: int) -> None:
    """Send the probe (fast, by the full key: shadowed on precise) and wait until the gateway
    has finished a shadow more than the ``done`` before the request under test, and runs none;
    ``sim`` must have received the probe's shadow and nothing else since it had counted
    ``before`` requests."""
    body = {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": PROBE}]}
    resp = world.stack.post(body, key=world.keys.full)
    assert resp.status_code == 200, resp.text
    settled(world.stack, done)
    stats = sim.stats()
    assert PROBE in str(stats["last_request"]), "the probe's shadow did not reach the tier"
    assert stats["requests_total"] == before + 1, (
        "the tier received another request than the probe's shadow",
        stats["last_request"],
    )


def wait_for_request(sim: SimulatorProcess, before: int) -> dict[str, Any]:
    """The body of the next request ``sim`` receives after ``before`` (the shadow's)."""
    deadline = time.monotonic() + patience(5)
    while time.monotonic() < deadline:
        stats = sim.stats()
        if stats["requests_total"] > before:
            return dict(stats["last_request"])
        time.sleep(0.05)
    return {}


def test_a_shadow_does_not_send_remote_media_to_a_tier_that_forbids_it(world: World) -> None:
    """A URL allowed on fast must not reach precise (inline media only) through the shadow."""
    stack = world.stack
    done = settled(stack)  # an earlier test's shadow is not counted as this one's
    before = stack.precise.stats()["requests_total"]
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": PUBLIC}},
    ]
    resp = stack.post(
        {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]},
        key=world.keys.full,
    )
    assert resp.status_code == 200, resp.text
    only_the_probe_reached(world, stack.precise, before, done)
    assert PUBLIC not in str(stack.precise.stats()["last_request"])


def test_a_shadow_respects_the_target_tier_max_tokens_cap(world: World) -> None:
    """A precise request with max_tokens 2000 is shadowed on fast (cap 32) above its cap."""
    stack = world.stack
    before = stack.fast.stats()["requests_total"]
    resp = stack.post(
        {
            "model": "precise",
            "max_tokens": 2000,
            "messages": [{"role": "user", "content": "write a long story"}],
        },
        key=world.keys.full,
    )
    assert resp.status_code == 200, resp.text
    seen = wait_for_request(stack.fast, before)
    assert seen, "no shadow reached fast"
    asked = max(int(seen.get("max_tokens") or 0), int(seen.get("max_completion_tokens") or 0))
    assert asked <= FAST_CAP, f"the shadow asked fast for {asked} tokens (cap {FAST_CAP})"


def test_a_shadow_never_sends_a_prompt_to_a_tier_the_key_may_not_use(world: World) -> None:
    """A fast-only key's prompts stay off precise: allowed_tiers binds shadows too."""
    stack = world.stack
    done = settled(stack)  # an earlier test's shadow is not counted as this one's
    before = stack.precise.stats()["requests_total"]
    body = {
        "model": "fast",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "confidential: fast tier only"}],
    }
    resp = stack.post(body, key=world.keys.fast_only)
    assert resp.status_code == 200, resp.text
    only_the_probe_reached(world, stack.precise, before, done)
    assert "confidential" not in str(stack.precise.stats()["last_request"]), (
        "a fast-only key's prompt was sent to precise by a shadow"
    )
