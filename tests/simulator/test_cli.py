"""The command line: defaults per profile and argument validation."""

from __future__ import annotations

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
