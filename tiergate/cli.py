"""``tiergate`` entry point.

``tiergate simulate ...`` runs the vLLM simulator and ``tiergate bench ...`` the load
generator (their own packages, which the gateway never imports); every other sub-command
belongs to the gateway.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the simulator or the gateway command line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "simulate":
        from simulator.cli import main as simulate  # noqa: PLC0415  # imported only when used

        return simulate(args[1:])
    if args and args[0] == "bench":
        from loadgen.cli import main as bench  # noqa: PLC0415  # imported only when used

        return bench(args[1:])
    from gateway.cli import main as gateway  # noqa: PLC0415  # keeps `simulate` light

    return gateway(args)


if __name__ == "__main__":
    raise SystemExit(main())
