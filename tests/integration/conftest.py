"""Real simulator and gateway processes shared by the integration tests of one module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess, start_simulator

__all__ = ["start_simulator"]


@pytest.fixture(scope="module")
def fast_sim() -> Iterator[SimulatorProcess]:
    """A zero-latency fast-tier simulator."""
    with SimulatorProcess(
        "--profile",
        "fast",
        "--model",
        "tiergate-fast",
        "--latency-scale",
        "0",
        "--max-model-len",
        "2048",
    ) as sim:
        yield sim


@pytest.fixture(scope="module")
def precise_sim() -> Iterator[SimulatorProcess]:
    """A zero-latency precise-tier simulator."""
    with SimulatorProcess(
        "--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0"
    ) as sim:
        yield sim


@pytest.fixture(scope="module")
def gateway(fast_sim: SimulatorProcess, precise_sim: SimulatorProcess) -> Iterator[GatewayProcess]:
    """A gateway in front of both simulators, auth off, small body limit and token cap."""
    config = {
        "auth": {"enabled": False},
        "server": {"max_body_bytes": 65536},
        "tiers": tiers_config([fast_sim.url], [precise_sim.url], max_tokens_cap=1000),
    }
    with GatewayProcess(config) as gw:
        yield gw
