"""Tenant balance of shadow training rows, and tenants read from the store (old records too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from router_models.training.shadow_train import read_shadow, store_files
from router_models.training.tenant_balance import UNKNOWN, level, summary, tenant_weights
from tests.router_models.test_shadow_train import COMPLEX, SIMPLE, record, write_store


def test_a_tenant_above_the_share_is_brought_down_to_the_others() -> None:
    """20x the rows of another: with the default 0.5 both weigh the same; nobody is raised."""
    tenants = ["a"] * 200 + ["b"] * 10
    weights = tenant_weights(tenants)
    assert weights[:200] == pytest.approx(np.full(200, 10 / 200))
    assert weights[200:].tolist() == [1.0] * 10
    assert summary(tenants, weights) == {
        "tenants": 2,
        "unknown_tenant_rows": 0,
        "largest_row_share": round(200 / 210, 4),
        "largest_weight_share": 0.5,
    }


def test_with_many_tenants_only_those_above_the_share_are_scaled() -> None:
    """The water level holds each capped tenant at exactly ``max_share`` of the total."""
    counts = [1000, 400, 100, 50, 50]
    cap = level(counts, 0.3)
    assert cap is not None
    weights = [min(n, cap) for n in counts]
    assert max(weights) / sum(weights) == pytest.approx(0.3)
    assert weights[2:] == [100, 50, 50]  # the small ones keep their full weight
    assert level(counts, 0.9) is None  # no tenant above 0.9: nothing changes


def test_a_share_below_one_per_tenant_means_equal_tenants() -> None:
    """0.1 with three tenants cannot hold: each weighs what the smallest does (share 1/3)."""
    cap = level([300, 200, 20], 0.1)
    assert cap == pytest.approx(20)


def test_one_tenant_or_share_one_changes_nothing() -> None:
    """A store of one tenant (or of old records only) trains exactly as before; 1.0 is off."""
    assert tenant_weights([UNKNOWN] * 50).tolist() == [1.0] * 50
    assert tenant_weights(["a"] * 90 + ["b"] * 10, 1.0).tolist() == [1.0] * 100
    with pytest.raises(ValueError, match="max_share"):
        tenant_weights(["a"], 0.0)


def test_records_carry_their_tenant_and_old_ones_read_as_unknown(tmp_path: Path) -> None:
    """One prompt from two tenants is two rows (one tenant's repeats never outvote the
    other's); a record written before the field existed is tenant unknown; a non-string is
    a corrupt record."""
    store = write_store(
        tmp_path / "s.jsonl",
        [
            record(SIMPLE[0], 1.0) | {"tenant": "a"},
            record(SIMPLE[0], 1.0) | {"tenant": "a"},
            record(SIMPLE[0], 1.0) | {"tenant": "a"},
            record(SIMPLE[0], 0.0) | {"tenant": "b"},
            record(COMPLEX[0], 0.1),  # an older gateway's line: no "tenant" key
        ],
    )
    shadow = read_shadow(store_files(store))
    assert shadow.records == 5
    rows = sorted(zip(shadow.tenants, shadow.y.tolist(), shadow.agreement.tolist(), strict=True))
    assert rows == [(UNKNOWN, 1.0, pytest.approx(0.1)), ("a", 0.0, 1.0), ("b", 1.0, 0.0)]
    held = shadow.subset(np.asarray([t == "a" for t in shadow.tenants]))
    assert held.tenants == ["a"]
    write_store(store, [record(SIMPLE[0], 1.0) | {"tenant": 7}])
    with pytest.raises(ValueError, match="tenant must be a string"):
        read_shadow(store_files(store))
