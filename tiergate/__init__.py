"""The ``tiergate`` console script: dispatches to the gateway or to the simulator."""
