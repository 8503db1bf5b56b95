"""What a request costs on each tier, and what routing saved against an all-precise fleet.

Costs are in the operator's units (GPU-seconds, money, or the default relative units in
which a precise token costs 1 and a fast one a quarter), per 1,000 input and output tokens.
A tier may instead be priced per replica-hour with its measured output tokens per second
(``tiergate bench``): then ``output_per_1k = replica_hour / (tokens_per_s * 3.6)`` and input
tokens cost a tenth of that (prefill is that much cheaper per token on GPUs, roughly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PREFILL_DISCOUNT = 0.1


@dataclass(frozen=True, slots=True)
class TierPrice:
    """Cost per 1,000 input and output tokens on one tier."""

    input_per_1k: float
    output_per_1k: float

    @classmethod
    def from_replica_hour(cls, replica_hour: float, tokens_per_s: float) -> TierPrice:
        """Price a tier from its hourly cost and its measured output throughput."""
        if tokens_per_s <= 0:
            raise ValueError("tokens_per_s must be positive")
        output = replica_hour / (tokens_per_s * 3.6)
        return cls(output * PREFILL_DISCOUNT, output)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """The cost of one request's tokens."""
        return (input_tokens * self.input_per_1k + output_tokens * self.output_per_1k) / 1000


@dataclass(frozen=True, slots=True)
class CostModel:
    """Every tier's price, and which tier is the all-precise baseline."""

    prices: Mapping[str, TierPrice]
    baseline_tier: str

    def cost(self, tier: str, input_tokens: int, output_tokens: int) -> float:
        """The cost of ``tier`` serving these tokens (0 for a tier without a price)."""
        price = self.prices.get(tier)
        return price.cost(input_tokens, output_tokens) if price is not None else 0.0

    def baseline(self, input_tokens: int, output_tokens: int) -> float:
        """What the same tokens would have cost on the precise tier."""
        return self.cost(self.baseline_tier, input_tokens, output_tokens)

    def savings(self, tier: str, input_tokens: int, output_tokens: int) -> float:
        """Baseline minus actual: positive when a cheaper tier served the request."""
        return self.baseline(input_tokens, output_tokens) - self.cost(
            tier, input_tokens, output_tokens
        )
