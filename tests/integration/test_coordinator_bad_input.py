"""Hypothesis-generated requests over the wire: never a crash, never a changed record."""

from __future__ import annotations

import grpc
import pytest
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
        gate=st.none() | st.builds(pb.GateSpawn, pid_hint=st.integers(0, 2**32 - 1), token_secret=text,
                                   spawn_token_env=text),
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
    # cluster identity, host, the host's last registration (kept for fencing after a lapse), record,
    # fence key, history entry, operation result
    assert len(before) == 7

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


STREAMS = ("WatchSessions", "Hold")  # refused at their first read
PATH_TRICKS = ["../session-fixed-1", "session-fixed-1/../x", "/session-fixed-1", "a/b/c/d/e/f/g/h",
               "session-fixed-1\0", "\0" * 16, "s" * 129, "s" * 100_000, "session-fixed-1/",
               "%2e%2e%2fabcdefg"]
HUGE_FENCES = [0, 2**63, 2**64 - 1]
OP = "0" * 32


def session_requests(sid: str) -> list[tuple[str, object]]:
    """Every Coordinator RPC that names a session, with a well-formed rest, so only `sid` is wrong."""
    return [
        ("Acquire", pb.AcquireRequest(session_id=sid, host_id="host-fuzz", operation_id=OP)),
        ("Hold", pb.AcquireRequest(session_id=sid, host_id="host-fuzz", operation_id=OP)),
        ("CommitOwner", pb.CommitOwnerRequest(session_id=sid, fence=1, secret="s")),
        ("RecordProviderHandle", pb.RecordProviderHandleRequest(session_id=sid, fence=1, secret="s",
                                                                handle="h")),
        ("Release", pb.ReleaseRequest(session_id=sid, fence=1, secret="s")),
        ("RequestHandoff", pb.RequestHandoffRequest(session_id=sid, operation_id=OP, host_id="host-fuzz")),
        ("FencedPut", pb.FencedPutRequest(session_id=sid, fence=1, secret="s", key="k", value=b"v")),
        ("FencedGet", pb.FencedGetRequest(session_id=sid, key="k")),
        ("GetSession", pb.GetSessionRequest(session_id=sid)),
        ("ProbeSession", pb.ProbeSessionRequest(session_id=sid)),
        ("Recover", pb.RecoverRequest(session_id=sid, expected_fence=1, reason="r", operator="o")),
        ("ListSessions", pb.ListSessionsRequest(page_token=sid)),
        ("WatchSessions", pb.WatchSessionsRequest(session_id=sid)),
    ]


def fence_requests(fence: int) -> list[tuple[str, object]]:
    # Acquire's expected fence 0 is a real expectation (nothing owned yet), refused as STALE_FENCE.
    acquire = [(method, pb.AcquireRequest(session_id=SID, host_id="host-fuzz", operation_id="1" * 32,
                                          expected_fence=fence, has_expected_fence=True))
               for method in ("Acquire", "Hold")] if fence else []
    return [
        *acquire,
        ("CommitOwner", pb.CommitOwnerRequest(session_id=SID, fence=fence, secret="s")),
        ("RecordProviderHandle", pb.RecordProviderHandleRequest(session_id=SID, fence=fence, secret="s",
                                                                handle="h")),
        ("Release", pb.ReleaseRequest(session_id=SID, fence=fence, secret="s")),
        ("FencedPut", pb.FencedPutRequest(session_id=SID, fence=fence, secret="s", key="k", value=b"v")),
        ("Recover", pb.RecoverRequest(session_id=SID, expected_fence=fence, reason="r", operator="o")),
    ]


def test_path_tricks_and_out_of_range_fences_are_invalid_for_every_rpc(coordinator: Coordinator, etcd,
                                                                      prefix) -> None:
    coord = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(coordinator.address))
    reg = pb.HostRegistration(host_id="host-fuzz", address="127.0.0.99:1",
                              spawn_token_env="HOLDFAST_SPAWN_TOKEN")
    coord.RegisterHost(pb.RegisterHostRequest(registration=reg, ttl_seconds=60), timeout=10)
    coord.Acquire(pb.AcquireRequest(session_id=SID, host_id="host-fuzz", operation_id=OP), timeout=10)
    before = snapshot(etcd.url, prefix)
    cases = [c for sid in PATH_TRICKS for c in session_requests(sid)]
    cases += [c for fence in HUGE_FENCES for c in fence_requests(fence)]
    # Data keys that try to leave the session's own prefix.
    cases += [(m, r) for key in ("../x", "a/../../b", "k\0", "..", "k" * 300) for m, r in (
        ("FencedPut", pb.FencedPutRequest(session_id=SID, fence=1, secret="s", key=key, value=b"v")),
        ("FencedGet", pb.FencedGetRequest(session_id=SID, key=key)))]
    for method, request in cases:
        with pytest.raises(grpc.RpcError) as err:
            reply = getattr(coord, method)(request, timeout=10)
            if method in STREAMS:
                next(iter(reply))
        code = err.value.code()  # type: ignore[attr-defined]
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, str(request)[:200])
    assert snapshot(etcd.url, prefix) == before
    # A negative fence cannot even be put on the wire: the uint64 field refuses it client-side.
    with pytest.raises(ValueError):
        pb.ReleaseRequest(session_id=SID, fence=-1)
    assert coordinator.process is not None and coordinator.process.poll() is None
