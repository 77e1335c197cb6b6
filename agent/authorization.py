"""Who may call the HostAgent: coordinators only (docs/design.md §4: only coordinators call agents,
so a runtime's or another node's certificate can neither probe nor kill through this agent).

A pure rule, run by holdfast.common.authorization's gate before any handler.
"""

from __future__ import annotations

from holdfast.common.authorization import Refusal, no_role, wrong_role
from holdfast.common.tls import Role


def agent_rule(method: str, role: Role | None, request: object) -> Refusal | None:
    if role is None:
        return no_role(method)
    return None if role.kind == "coordinator" else wrong_role(method, role, "a coordinator certificate")
