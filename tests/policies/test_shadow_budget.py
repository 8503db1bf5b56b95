"""The per-tenant shadow sample budget: a flooding tenant is capped, the others are not."""

from __future__ import annotations

from policies.shadow_budget import TenantSampleBudget


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_past_its_cap_is_refused_and_the_others_are_not() -> None:
    """Three samples a minute: a fourth for one tenant is refused, another still gets its own."""
    budget = TenantSampleBudget(3, Clock())
    assert [budget.take("a") for _ in range(5)] == [True, True, True, False, False]
    assert budget.take("b")
    assert budget.taken == {"a": 3, "b": 1}  # a refusal counts nothing


def test_the_next_minute_starts_a_new_budget_and_forgets_the_old() -> None:
    """After 60 s the counts are dropped (memory: the tenants of one minute only)."""
    clock = Clock()
    budget = TenantSampleBudget(1, clock)
    assert budget.take("a")
    assert not budget.take("a")
    clock.now += 59.9
    assert not budget.take("a")
    clock.now += 0.1
    assert budget.take("a")
    assert budget.taken == {"a": 1}


def test_no_cap_takes_everything() -> None:
    """``None`` (the setting null) is uniform sampling, as before the budget."""
    budget = TenantSampleBudget(None, Clock())
    assert all(budget.take("a") for _ in range(1000))
    assert budget.taken == {}
