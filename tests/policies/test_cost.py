"""Tier prices, per-request cost and savings against sending everything to precise."""

from __future__ import annotations

import pytest

from policies.cost import CostModel, TierPrice


def model() -> CostModel:
    """Fast at a quarter of precise's price."""
    return CostModel({"fast": TierPrice(0.25, 0.25), "precise": TierPrice(1.0, 1.0)}, "precise")


def test_cost_is_per_thousand_tokens() -> None:
    """2,000 input and 1,000 output tokens on precise cost 3 units."""
    assert model().cost("precise", 2000, 1000) == pytest.approx(3.0)
    assert model().cost("fast", 2000, 1000) == pytest.approx(0.75)


def test_savings_against_all_precise() -> None:
    """A fast-served request saves three quarters; a precise one saves nothing."""
    assert model().savings("fast", 1000, 1000) == pytest.approx(1.5)
    assert model().savings("precise", 1000, 1000) == 0.0


def test_replica_hour_pricing() -> None:
    """At 2 units an hour and 1,000 tokens/s, an output token costs 2/3.6 per million."""
    price = TierPrice.from_replica_hour(2.0, 1000.0)
    assert price.output_per_1k == pytest.approx(2.0 / 3600)
    assert price.input_per_1k == pytest.approx(price.output_per_1k * 0.1)
    with pytest.raises(ValueError, match="positive"):
        TierPrice.from_replica_hour(1.0, 0)


def test_unpriced_tier_costs_nothing() -> None:
    """A tier without a price is free (and so saves the whole baseline)."""
    assert model().cost("other", 1000, 1000) == 0.0
