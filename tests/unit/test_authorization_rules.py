"""The role rules as pure functions: every RPC of both services has a decision, none by default."""

from __future__ import annotations

import grpc
import pytest

from holdfast.agent.authorization import agent_rule
from holdfast.common.tls import Role
from holdfast.coordinator.authorization import (
    HOST_CALLS,
    OPERATOR_CALLS,
    READS,
    RETENTION_CALLS,
    SESSION_WRITES,
    coordinator_rule,
)
from holdfast.v1 import agent_pb2
from holdfast.v1 import coordinator_pb2 as pb

COORDINATOR_METHODS = set(pb.DESCRIPTOR.services_by_name["Coordinator"].methods_by_name)
ROLES = [Role("client"), Role("coordinator"), Role("agent", "h1"), Role("agent", "h2"), Role("etcd"),
         Role("operator"), Role("maintenance")]
CLASSES = (READS, SESSION_WRITES, OPERATOR_CALLS, RETENTION_CALLS, HOST_CALLS)


def test_every_coordinator_rpc_is_classified_exactly_once() -> None:
    # A new RPC must be decided here; until then the rule refuses it (see the next test).
    assert frozenset().union(*CLASSES) == COORDINATOR_METHODS
    assert sum(len(c) for c in CLASSES) == len(COORDINATOR_METHODS), "a method in two classes"


def test_the_operator_calls_are_those_of_design_section_4() -> None:
    # Recover releases a live owner without stopping it: one runtime key must not be able to.
    assert {"Recover", "RecoverHost", "FenceHost", "RestoreEpoch", "ArchiveSession",
            "DrainHost"} == OPERATOR_CALLS
    assert {"PurgeArchives"} == RETENTION_CALLS
    for method in OPERATOR_CALLS | RETENTION_CALLS:
        refusal = coordinator_rule(method, Role("client"), None)
        assert refusal is not None and refusal.code == grpc.StatusCode.PERMISSION_DENIED
        assert refusal.reason == "WRONG_ROLE" and "operator certificate" in refusal.message


def test_an_unlisted_method_is_refused_to_every_role() -> None:
    for role in ROLES:
        refusal = coordinator_rule("SomethingNew", role, None)
        assert refusal is not None and refusal.code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("method", sorted(COORDINATOR_METHODS))
def test_no_role_is_unauthenticated_everywhere(method: str) -> None:
    refusal = coordinator_rule(method, None, pb.HeartbeatRequest(host_id="h1"))
    assert refusal is not None and refusal.code == grpc.StatusCode.UNAUTHENTICATED
    assert agent_rule(method, None, None) is not None


@pytest.mark.parametrize("role", ROLES)
def test_who_may_do_what(role: Role) -> None:
    for method in READS:
        assert coordinator_rule(method, role, None) is None
    for method in SESSION_WRITES:
        assert (coordinator_rule(method, role, None) is None) == (role.kind in ("client", "operator"))
    for method in OPERATOR_CALLS:
        assert (coordinator_rule(method, role, None) is None) == (role.kind == "operator")
    for method in RETENTION_CALLS:
        assert (coordinator_rule(method, role, None) is None) == (role.kind in ("operator", "maintenance"))
    register = pb.RegisterHostRequest(registration=pb.HostRegistration(host_id="h1"))
    heartbeat = pb.HeartbeatRequest(host_id="h1")
    for method, request in (("RegisterHost", register), ("Heartbeat", heartbeat)):
        assert (coordinator_rule(method, role, request) is None) == (role == Role("agent", "h1"))
    for method in agent_pb2.DESCRIPTOR.services_by_name["HostAgent"].methods_by_name:
        assert (agent_rule(method, role, None) is None) == (role.kind == "coordinator")
