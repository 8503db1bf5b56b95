"""P5 measured as the hardening issue measured it: `kill -9` of one of two precise replicas.

    .venv/bin/python -m bench.faults.kill_replica [--runs 2] [--after 200]

50 closed-loop clients send non-streaming (then streaming) requests to a real gateway in front
of two real simulator replicas; one replica is SIGKILLed once 50 answers are in and it has
requests running, and the run ends ``--after`` answers later. Prints, per run, the
requests sent and the client errors (non-200 answers; for streams also those that ended
without ``[DONE]``, which is the in-band error contract for streams already running).
"""

from __future__ import annotations

import argparse
import asyncio

from tests.adversarial.test_replica_crash import PRECISE, load, settings
from tests.integration.gateway_proc import GatewayProcess
from tests.simulator.procs import SimulatorProcess


def one_run(stream: bool, after: int) -> tuple[int, int, int]:
    """(requests, non-200 answers, streams cut in-band) for one run."""
    with (
        SimulatorProcess(*PRECISE, "--seed", "1") as a,
        SimulatorProcess(*PRECISE, "--seed", "2") as b,
        GatewayProcess(settings([a.url, b.url])) as gateway,
    ):
        results = asyncio.run(load(gateway.url, b, stream=stream, after=after))
    errors = sum(1 for status, _, _ in results if status != 200)
    cut = sum(1 for status, complete, _ in results if status == 200 and not complete)
    return len(results), errors, cut


def main() -> int:
    """Run and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--after", type=int, default=200, help="answers after the kill")
    args = parser.parse_args()
    for stream in (False, True):
        for run in range(1, args.runs + 1):
            sent, errors, cut = one_run(stream, args.after)
            kind = "streaming" if stream else "non-streaming"
            print(
                f"{kind} run {run}: {sent} requests, {errors} client errors (non-200)"
                + (f", {cut} running streams ended by an in-band error event" if stream else "")
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
