"""Real simulator processes shared by the integration tests of one module (its gateway comes
from tests/stack.py's running_stack or a fixture of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
