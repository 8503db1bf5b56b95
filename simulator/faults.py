"""Seeded failure injection: what goes wrong, and how often.

Errors before the response (status codes, refused or reset connections) are mutually
exclusive and drawn with one uniform number, so each rate is exact when they sum to at most
1. A first-byte stall is drawn independently (a stalled request may still succeed). The three
mid-stream faults are drawn together, again exclusively, and apply to streaming requests.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from typing import Any

# Order matters only for how the unit interval is carved up.
PRE_RESPONSE = (
    "fail_refuse",
    "fail_reset",
    "fail_429",
    "fail_400",
    "fail_404",
    "fail_500",
    "fail_503",
)
MID_STREAM = ("stall_mid_stream", "drop_mid_stream", "error_mid_stream")


@dataclass(slots=True)
class FaultRates:
    """Per-type probabilities in [0, 1] plus the stall length in seconds."""

    fail_429: float = 0.0
    fail_400: float = 0.0
    fail_404: float = 0.0
    fail_500: float = 0.0
    fail_503: float = 0.0
    fail_refuse: float = 0.0
    fail_reset: float = 0.0
    stall_first_byte: float = 0.0
    stall_seconds: float = 5.0
    stall_mid_stream: float = 0.0
    drop_mid_stream: float = 0.0
    error_mid_stream: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """The rates as plain JSON-able data."""
        return asdict(self)


FIELD_NAMES = frozenset(f.name for f in fields(FaultRates))


class FaultInjector:
    """Draws faults from a seeded RNG; reconfigurable at runtime."""

    def __init__(self, rates: FaultRates, seed: int) -> None:
        self.rates = rates
        self._rng = random.Random(seed)  # noqa: S311 - simulation draws, not security
        self.active = False
        self._refresh()

    def _refresh(self) -> None:
        rates = self.rates
        self.active = any(
            getattr(rates, name) > 0 for name in (*PRE_RESPONSE, *MID_STREAM, "stall_first_byte")
        )

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a partial update; raises ValueError/TypeError on a bad field or value."""
        checked: dict[str, float] = {}
        for name, value in changes.items():
            if name not in FIELD_NAMES:
                raise ValueError(f"unknown fault field {name!r}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number")
            limit = float("inf") if name == "stall_seconds" else 1.0
            if not 0.0 <= value <= limit:
                raise ValueError(f"{name} must be between 0 and {limit}")
            checked[name] = float(value)
        for name, value in checked.items():
            setattr(self.rates, name, value)
        self._refresh()

    def _pick(self, names: tuple[str, ...]) -> str | None:
        draw = self._rng.random()
        edge = 0.0
        for name in names:
            edge += getattr(self.rates, name)
            if draw < edge:
                return name
        return None

    def pre_response(self) -> str | None:
        """The fault replacing this response, if any (a name from ``PRE_RESPONSE``)."""
        return self._pick(PRE_RESPONSE) if self.active else None

    def stall_first_byte(self) -> float:
        """Seconds to stall before the first byte (0 for no stall)."""
        rate = self.rates.stall_first_byte
        if rate > 0 and self._rng.random() < rate:
            return self.rates.stall_seconds
        return 0.0

    def mid_stream(self) -> str | None:
        """The fault to inject half-way through a stream, if any (a name from ``MID_STREAM``)."""
        return self._pick(MID_STREAM) if self.active else None
