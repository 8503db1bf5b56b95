"""The command line: defaults per profile and argument validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simulator.cli import build_parser, config_from_args


def test_profile_defaults() -> None:
    """Each profile serves its own default model name."""
    precise = config_from_args(build_parser().parse_args(["--profile", "precise"]))
    fast = config_from_args(build_parser().parse_args(["--model", "m", "--fail-500", "0.5"]))
    assert precise.model == "tiergate-precise"
    assert precise.profile.inter_token_s == 0.012
    assert fast.model == "m"
    assert fast.faults.fail_500 == 0.5
    assert fast.max_queue is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--fail-429", "1.5"],
        ["--max-num-seqs", "0"],
        ["--latency-scale", "-1"],
        ["--queue-full-status", "500"],
    ],
)
def test_bad_arguments_exit(argv: list[str]) -> None:
    """Out-of-range options are usage errors."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_out_of_range_ports_are_usage_errors(port: str) -> None:
    """A port outside 0-65535 is refused, not taken modulo 65536 by the socket layer."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--port", port])
    assert exited.value.code == 2


@pytest.mark.parametrize("port", ["0", "65535"])
def test_the_ends_of_the_port_range_are_accepted(port: str) -> None:
    """0 (a free port) and 65535 are valid ports."""
    assert build_parser().parse_args(["--port", port]).port == int(port)


def test_tiergate_simulate_refuses_port_70000_with_exit_2() -> None:
    """`tiergate simulate --port 70000` exits 2 with a usage error, like `serve` does."""
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "simulate", "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "70000 is not a port number (0-65535)" in result.stderr
