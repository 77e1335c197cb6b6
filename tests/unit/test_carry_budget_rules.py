"""The carry budget rules (coordinator/carry_budget_rules.py): a reservation is charged to the cluster
and to its tenant and given back to exactly those; a refusal names the budget it would overspend."""

from __future__ import annotations

import pytest

from holdfast.coordinator.carry_budget_rules import CLUSTER, CarryLimits, Charge, after, moves, refusal


def test_a_charge_moves_the_cluster_and_its_tenant_alike() -> None:
    assert moves([], [Charge("team-a", 300)]) == {CLUSTER: 300, "team-a": 300}
    assert moves([Charge("team-a", 300)], []) == {CLUSTER: -300, "team-a": -300}


def test_a_slot_reserved_before_tenants_is_given_back_to_the_cluster_alone() -> None:
    # No tenant was charged for it: taking it from one would count bytes it never had.
    assert moves([Charge(CLUSTER, 300)], []) == {CLUSTER: -300}


def test_a_replaced_copy_gives_back_to_whom_it_charged_even_when_the_tenant_changed() -> None:
    moved = moves([Charge("team-a", 300)], [Charge("team-b", 200)])
    assert moved == {CLUSTER: -100, "team-a": -300, "team-b": 200}
    # The same tenant: its account and the cluster's move by the difference, and are still read.
    assert moves([Charge("team-a", 300)], [Charge("team-a", 300)]) == {CLUSTER: 0, "team-a": 0}


def test_an_account_never_reads_below_zero() -> None:
    assert after({CLUSTER: 100, "team-a": 0}, {CLUSTER: -300, "team-a": -300}) == {CLUSTER: 0, "team-a": 0}


def test_a_tenant_past_its_own_budget_is_refused_while_the_cluster_has_room() -> None:
    limits = CarryLimits(budget=1000, tenant_budget=400)
    moved = moves([], [Charge("team-a", 300)])
    why = refusal({CLUSTER: 300, "team-a": 300}, moved, limits)
    assert why is not None and "tenant team-a" in why and "carry_tenant_budget_bytes" in why
    assert refusal({CLUSTER: 300, "team-b": 0}, moves([], [Charge("team-b", 300)]), limits) is None


def test_the_cluster_budget_is_named_when_it_is_the_one_overspent() -> None:
    limits = CarryLimits(budget=1000, tenant_budget=900)
    why = refusal({CLUSTER: 800, "team-b": 0}, moves([], [Charge("team-b", 300)]), limits)
    assert why is not None and "the cluster's" in why and "carry_budget_bytes" in why


def test_no_per_tenant_budget_by_default() -> None:
    limits = CarryLimits(budget=1000)
    assert limits.tenant_budget == 0 and limits.limit("team-a") is None
    assert refusal({CLUSTER: 0, "team-a": 0}, moves([], [Charge("team-a", 1000)]), limits) is None


def test_an_account_the_reservation_does_not_grow_never_refuses_it() -> None:
    # The budget lowered below what is held: a copy replaced by a smaller one still lands.
    limits = CarryLimits(budget=100, tenant_budget=100)
    assert refusal({CLUSTER: 500, "team-a": 500}, moves([Charge("team-a", 300)], [Charge("team-a", 200)]),
                   limits) is None


def test_limits_are_checked_when_made() -> None:
    with pytest.raises(ValueError):
        CarryLimits(session_cap=0)
    with pytest.raises(ValueError):
        CarryLimits(tenant_budget=-1)
