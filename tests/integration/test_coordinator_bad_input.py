"""Hypothesis-generated requests over the wire: never a crash, never a changed record."""

from __future__ import annotations

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.coordinator_fixtures import Coordinator, snapshot

pytest_plugins = ["tests.integration.coordinator_fixtures"]

SID = "session-fixed-1"
text = st.text(max_size=200)
fences = st.integers(min_value=0, max_value=2**64 - 1)

REQUESTS = st.one_of(
    st.builds(
        pb.AcquireRequest,
        session_id=text,
        operation_id=text,
        host_id=text,
        expected_fence=fences,
        has_expected_fence=st.booleans(),
        wait_seconds=st.floats(-1e9, 1e9, allow_nan=False),
    ),
    st.builds(
        pb.CommitOwnerRequest, session_id=st.sampled_from([SID, "x"]) | text, fence=fences, secret=text
    ),
    st.builds(pb.ReleaseRequest, session_id=st.sampled_from([SID]) | text, fence=fences, secret=text),
    st.builds(
        pb.FencedPutRequest,
        session_id=st.sampled_from([SID]) | text,
        fence=fences,
        secret=text,
        key=text,
        value=st.binary(max_size=64),
    ),
    st.builds(
        pb.RecordProviderHandleRequest,
        session_id=st.sampled_from([SID]) | text,
        fence=fences,
        secret=text,
        handle=text,
    ),
    st.builds(pb.RecoverRequest, session_id=text, expected_fence=fences, reason=text, operator=text),
    st.builds(pb.RequestHandoffRequest, session_id=text, operation_id=text, host_id=text),
    st.builds(pb.HeartbeatRequest, host_id=text, lease_id=st.integers(-(2**63), 2**63 - 1)),
)
METHODS = {
    pb.AcquireRequest: "Acquire",
    pb.CommitOwnerRequest: "CommitOwner",
    pb.ReleaseRequest: "Release",
    pb.FencedPutRequest: "FencedPut",
    pb.RecordProviderHandleRequest: "RecordProviderHandle",
    pb.RecoverRequest: "Recover",
    pb.RequestHandoffRequest: "RequestHandoff",
    pb.HeartbeatRequest: "Heartbeat",
}
CLEAN_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ABORTED,
}


def test_bad_input_never_crashes_nor_writes(coordinator: Coordinator, etcd, prefix) -> None:
    coord = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator.address))
    # One real reserved session and one registered host, so there is something garbage could damage.
    reg = pb.HostRegistration(
        host_id="host-fuzz", address="127.0.0.99:1", spawn_token_env="HOLDFAST_SPAWN_TOKEN"
    )
    coord.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=60), timeout=10)
    coord.Acquire(pb.AcquireRequest(session_id=SID, host_id="host-fuzz", operation_id="0" * 32), timeout=10)
    before = snapshot(etcd.url, prefix)
    assert len(before) == 5  # host, record, fence key, history entry, operation result

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(REQUESTS)
    def check(request) -> None:  # type: ignore[no-untyped-def]
        try:
            getattr(coord, METHODS[type(request)])(request, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() in CLEAN_REFUSALS, exc  # type: ignore[attr-defined]
        assert snapshot(etcd.url, prefix) == before

    check()
    assert coordinator.process is not None and coordinator.process.poll() is None
