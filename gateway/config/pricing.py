"""Each tier's price as the usage ledger applies it, and the prices that cannot be meant.

``tiers.<name>.cost`` sets a price per 1,000 tokens, or per replica-hour with the tokens a
replica serves per second (``policies.cost``); a tier without one costs 1 per 1,000 tokens on
the precise tier and a quarter of that elsewhere. A fast tier that costs more than the precise
one makes every fast request a loss in ``/admin/usage`` (a negative ``savings_share``), which
is almost always a typo: :func:`price_warnings` names each such price, for ``tiergate config
check`` and a warning at start-up (which is not refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.router_settings import RouterSettings
from gateway.config.tier_settings import TierSettings
from policies.cost import TierPrice

FAST_RELATIVE_PRICE = 0.25  # an INT4 tier's token at about a quarter of an FP16 one's


def tier_prices(tiers: Mapping[str, TierSettings], precise: str) -> dict[str, TierPrice]:
    """Each tier's configured price; unset: 1 per 1k tokens on ``precise``, 0.25 elsewhere."""
    prices: dict[str, TierPrice] = {}
    for name, tier in tiers.items():
        if tier.cost is not None:
            prices[name] = TierPrice(*tier.cost.prices())
        else:
            unit = 1.0 if name == precise else FAST_RELATIVE_PRICE
            prices[name] = TierPrice(unit, unit)
    return prices


@dataclass(frozen=True, slots=True)
class PriceWarning:
    """One price of a tier above the precise tier's."""

    setting: str  # tiers.<name>.cost
    price: str  # input_per_1k, output_per_1k or replica_hour
    value: float
    precise_value: float

    def message(self) -> str:
        """The warning in words."""
        unit = "per replica-hour" if self.price == "replica_hour" else (
            "per 1,000 " + self.price.removesuffix("_per_1k") + " tokens"
        )  # fmt: skip
        return (
            f"{self.setting}: this tier costs more than the precise tier {unit} "
            f"({self.value!r} > {self.precise_value!r}); /admin/usage will show its requests "
            "as losses (negative savings). Check the prices (docs/savings.md)."
        )


def price_warnings(tiers: Mapping[str, TierSettings], router: RouterSettings) -> list[PriceWarning]:
    """Every price of a tier other than the precise one that is above the precise tier's."""
    precise = router.precise_tier
    if precise not in tiers:
        return []
    prices = tier_prices(tiers, precise)
    top = prices[precise]
    top_cost = tiers[precise].cost
    top_hour = top_cost.replica_hour if top_cost is not None else None
    found: list[PriceWarning] = []
    for name, tier in tiers.items():
        if name == precise:
            continue
        setting = f"tiers.{name}.cost"
        price = prices[name]
        for label, mine, theirs in (
            ("input_per_1k", price.input_per_1k, top.input_per_1k),
            ("output_per_1k", price.output_per_1k, top.output_per_1k),
        ):
            if mine > theirs:
                found.append(PriceWarning(setting, label, _round(mine), _round(theirs)))
        hour = tier.cost.replica_hour if tier.cost is not None else None
        if hour is not None and top_hour is not None and hour > top_hour:
            found.append(PriceWarning(setting, "replica_hour", float(hour), float(top_hour)))
    return found


def _round(value: float) -> float:
    return round(value, 6)
