"""Shared simulator processes for the simulator tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.simulator.procs import SimulatorProcess, start_simulator

__all__ = ["start_simulator"]


@pytest.fixture(scope="session")
def zero_latency_sim() -> Iterator[SimulatorProcess]:
    """One zero-latency simulator shared by the tests that only read replies."""
    with SimulatorProcess(
        "--latency-scale", "0", "--seed", "7", "--enable-prompt-tokens-details"
    ) as sim:
        yield sim
        assert sim.stderr_text() == ""


@pytest.fixture
def sim(zero_latency_sim: SimulatorProcess) -> SimulatorProcess:
    """The shared simulator with fresh counters, no faults and healthy."""
    zero_latency_sim.set_faults(
        fail_429=0,
        fail_400=0,
        fail_404=0,
        fail_500=0,
        fail_503=0,
        fail_refuse=0,
        fail_reset=0,
        stall_first_byte=0,
        stall_mid_stream=0,
        drop_mid_stream=0,
        error_mid_stream=0,
        healthy=True,
    )
    zero_latency_sim.reset()
    return zero_latency_sim
