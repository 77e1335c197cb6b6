"""Pure rules of the carry budgets (docs/carry.md): the cluster's and each tenant's, which bytes a
reservation and a give-back move, and which budget refuses a reservation.

Guarantee: no I/O. Every reservation's bytes are charged to the cluster's account and to the tenant
its slot names, and given back to exactly those accounts, so a tenant's account and the cluster's
count the same copies and a give-back never takes from an account what was charged to another. A
slot reserved before per-tenant budgets names no tenant: it was charged to the cluster alone and is
given back to the cluster alone. A reservation is refused when it grows an account past its limit —
the cluster's `carry_budget_bytes`, or any tenant's `carry_tenant_budget_bytes` when that is not 0 —
so one tenant filling its own budget leaves the rest of the cluster's to the others. An account
never reads below 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from holdfast.common.carry_rules import MAX_SESSION_CAP

DEFAULT_SESSION_CAP = 4 << 20
DEFAULT_BUDGET = 512 << 20  # 25 % of etcd's default 2 GiB quota
# 0: no tenant is limited beyond the cluster's budget (docs/decisions.md: a default that shrank a
# single-tenant cluster's budget would refuse uploads that fit before the upgrade).
DEFAULT_TENANT_BUDGET = 0
CLUSTER = ""  # the cluster's account; no tenant is "" (a tenant is a DNS label)


@dataclass(frozen=True)
class CarryLimits:
    """A coordinator's carry settings: the largest copy one session keeps, the cluster's budget for
    every copy together, and each tenant's (0: none beyond the cluster's)."""

    session_cap: int = DEFAULT_SESSION_CAP
    budget: int = DEFAULT_BUDGET
    tenant_budget: int = DEFAULT_TENANT_BUDGET

    def __post_init__(self) -> None:
        if not 0 < self.session_cap <= MAX_SESSION_CAP:
            raise ValueError(f"carry session cap {self.session_cap} is outside 1..{MAX_SESSION_CAP} bytes")
        if self.budget < 0 or self.tenant_budget < 0:
            raise ValueError("a carry budget is a number of bytes, 0 or more")

    def limit(self, account: str) -> int | None:
        """The most `account` may hold; None for a tenant when no per-tenant budget is set."""
        if account == CLUSTER:
            return self.budget
        return self.tenant_budget or None


DEFAULT_LIMITS = CarryLimits()


@dataclass(frozen=True)
class Charge:
    """The bytes one slot holds and the tenant they were charged to (CLUSTER: the cluster alone)."""

    tenant: str
    reserved: int

    def accounts(self) -> set[str]:
        return {CLUSTER, self.tenant}


def moves(given_back: Iterable[Charge], taken: Iterable[Charge]) -> dict[str, int]:
    """Per account touched, the change in its reserved bytes (0 when a give-back and a charge cancel:
    the account is still read and compared, and left as it is)."""
    out: dict[str, int] = {}
    for sign, charges in ((-1, given_back), (1, taken)):
        for charge in charges:
            for account in charge.accounts():
                out[account] = out.get(account, 0) + sign * charge.reserved
    return out


def after(used: Mapping[str, int], moved: Mapping[str, int]) -> dict[str, int]:
    """Each account's reserved bytes once `moved` lands: never below 0 (an account edited by hand,
    or one a give-back would take past what it holds, reads 0 rather than a credit)."""
    return {account: max(used[account] + delta, 0) for account, delta in moved.items()}


def refusal(used: Mapping[str, int], moved: Mapping[str, int], limits: CarryLimits) -> str | None:
    """Why the reservation is refused — the first budget it grows past its limit, named with the
    next step — or None. An account the reservation does not grow is never the reason: a copy
    replaced by a smaller one is taken even where a lowered budget is already overspent."""
    totals = after(used, moved)
    for account in sorted(moved):  # the cluster's ("") first
        limit = limits.limit(account)
        if limit is not None and moved[account] > 0 and totals[account] > limit:
            if account == CLUSTER:
                return (f"the cluster's carried state would reach {totals[account]} of its {limit}-byte "
                        "budget (carry_budget_bytes), shared by every tenant")
            return (f"tenant {account}'s carried state would reach {totals[account]} of its {limit}-byte "
                    "budget (carry_tenant_budget_bytes): archive that tenant's finished sessions")
    return None
