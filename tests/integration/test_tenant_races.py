"""A tenant's admission holds for the record its handler reads, against a real etcd: another tenant
makes the id between a scoped caller's admission read and the handler's own read (an awaited hook
right after the admission read, no sleep), and the caller still never gets that record, that
session's data, a write on it or an agent asked about it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from holdfast.common import certs
from holdfast.common.tls import Role
from holdfast.coordinator import keys
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Entry, Put, Seen, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.coordinator_fixtures import run_async
from tests.integration.txn_harness import (
    Context,
    Refused,
    acquire,
    pair,
    record_of,
    register,
    release,
    writes,
)

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(120)]
HOST = "host-race"
CALLERS = {"team-a": Role("client", "", "team-a"), "team-b": Role("client", "", "team-b"),
           "op-b": Role("operator", "", "team-b")}


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    base = Path(tmp_path_factory.mktemp("pki-tenant-races"))
    certs.init_local(base / "ca", [], ["127.0.0.1"])
    return {name: certs.issue_one(base / "ca", role, [], base / name).read_bytes()
            for name, role in CALLERS.items()}


class As(Context):
    """A peer whose verified certificate is `pem` (what gRPC hands a handler after the handshake)."""

    def __init__(self, pem: bytes) -> None:
        super().__init__()
        self.pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self.pem]}


class AfterFirstRead(Store):
    """A store that, once armed, awaits a hook right after the first read that includes `key`."""

    armed: tuple[str, Callable[[], Awaitable[None]]] | None = None

    async def _after(self, keys_read: Sequence[str]) -> None:
        armed = self.armed
        if armed is not None and armed[0] in keys_read:
            self.armed = None
            await armed[1]()

    async def get(self, key: str, revision: int = 0) -> Entry | None:
        entry = await super().get(key, revision)
        await self._after([key])
        return entry

    async def read_all(self, keys_read: Sequence[str]) -> list[Seen]:
        seen = await super().read_all(keys_read)
        await self._after(keys_read)
        return seen


def call(svc: CoordinatorService, rpc: str, sid: str, pems: dict[str, bytes]) -> Awaitable[object]:
    """B's call on the id, as the hostile tenant would make it."""
    b, op_b = As(pems["team-b"]), As(pems["op-b"])
    if rpc == "GetSession":
        return svc.GetSession(pb.GetSessionRequest(session_id=sid), b)
    if rpc == "FencedGet":
        return svc.FencedGet(pb.FencedGetRequest(session_id=sid, key="k"), b)
    if rpc == "RequestHandoff":
        return svc.RequestHandoff(pb.RequestHandoffRequest(session_id=sid, operation_id="b" * 32,
                                                           host_id=HOST), b)
    return svc.Recover(pb.RecoverRequest(session_id=sid, expected_fence=1, operator="b", reason="race"),
                       op_b)


@pytest.mark.parametrize("rpc", ["GetSession", "FencedGet", "RequestHandoff", "Recover"])
@run_async
async def test_an_id_made_by_another_tenant_after_admission_is_never_reached(
        etcd: EtcdServer, prefix: str, pems: dict[str, bytes], rpc: str) -> None:
    store = AfterFirstRead(open_channel(etcd.url), prefix)
    victim, other = CoordinatorService(store), CoordinatorService(Store(open_channel(etcd.url), prefix))
    try:
        sid = f"sess-race-{rpc.lower()}"
        await register(other, HOST)
        made: list[pb.SessionRecord | None] = []

        async def a_makes_it() -> None:
            await acquire(other, As(pems["team-a"]), sid, HOST)
            # a's fenced data, as its owner's FencedPut would leave it
            await other.store.txn([], [Put(keys.data(other.store, sid, "k"), b"a's secret")])
            made.append(await record_of(other, sid))

        store.armed = (store.key("sessions", sid), a_makes_it)
        try:
            answer = await call(victim, rpc, sid, pems)
        except Refused as refused:
            assert refused.reason in ("NOT_FOUND", "WRONG_TENANT"), refused
            answer = None
        assert made, "the hook ran: a's record existed before b's handler read anything"
        assert answer is None or (isinstance(answer, pb.FencedGetResponse) and not answer.found), answer
        assert await record_of(other, sid) == made[0], "nothing written on a's session"
    finally:
        await store.close()
        await other.store.close()


@run_async
async def test_two_tenants_making_one_id_at_once_bind_it_to_one(etcd: EtcdServer, prefix: str,
                                                                  pems: dict[str, bytes]) -> None:
    """B's grant read the id absent; A makes it before B's transaction: B's grant loses (it compares
    the record absent), and the re-read refuses B, which wrote nothing."""
    p = pair(etcd, prefix)
    try:
        sid = "sess-race-both"
        await register(p.other, HOST)

        async def a_makes_it() -> None:
            await acquire(p.other, As(pems["team-a"]), sid, HOST)

        p.store.arm(writes(p.key("sessions", sid)), a_makes_it)
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, As(pems["team-b"]), sid, HOST)
        assert refused.value.reason == "WRONG_TENANT"
        assert p.store.outcomes_for(p.key("sessions", sid)) == [False]
        record = await record_of(p.other, sid)
        assert record is not None and record.tenant == "team-a" and record.lease.fence == 1
    finally:
        await p.close()


@run_async
async def test_another_tenant_replaying_an_operation_id_never_gets_its_grant(
        etcd: EtcdServer, prefix: str, pems: dict[str, bytes]) -> None:
    """The replay key is the session, the peer's address, the host id and the operation id, not
    the tenant: B on A's host replaying A's operation is refused before the replay is looked at."""
    p = pair(etcd, prefix)
    try:
        sid, operation = "sess-race-replay", "a" * 32
        await register(p.other, HOST)
        granted = await acquire(p.other, As(pems["team-a"]), sid, HOST, operation)
        replayed = await acquire(p.victim, As(pems["team-a"]), sid, HOST, operation)  # a's replay
        assert granted.revision > 0 and replayed.revision == 0  # a replay's watch lists
        granted.revision = 0
        assert replayed == granted
        before, _ = await p.other.store.list_prefix(prefix)
        with pytest.raises(Refused) as refused:
            await acquire(p.victim, As(pems["team-b"]), sid, HOST, operation)
        assert refused.value.reason == "WRONG_TENANT" and granted.grant.secret not in str(refused.value)
        assert (await p.other.store.list_prefix(prefix))[0] == before
    finally:
        await p.close()


class CountsBindings(Store):
    """Counts the admission reads of a tenant binding (the record and archive record of one id)."""

    bindings_read = 0

    async def read_all(self, keys_read: Sequence[str]) -> list[Seen]:
        if len(keys_read) == 2 and keys_read[1].endswith("/record") and "/archive/" in keys_read[1]:
            self.bindings_read += 1
        return await super().read_all(keys_read)


@run_async
async def test_a_kept_binding_admits_a_runs_calls_without_reading_it(
        etcd: EtcdServer, prefix: str, pems: dict[str, bytes]) -> None:
    store = CountsBindings(open_channel(etcd.url), prefix)
    svc, a = CoordinatorService(store), As(pems["team-a"])
    try:
        sid = "sess-race-kept"
        await register(svc, HOST)
        first = await acquire(svc, a, sid, HOST)  # an id no tenant holds: read, nothing kept
        await release(svc, a, first.grant)  # read once more, and kept: it is team-a's
        read = store.bindings_read
        second = await acquire(svc, a, sid, HOST)
        await release(svc, a, second.grant)
        assert store.bindings_read == read, "a Release of a kept binding reads no binding"
        with pytest.raises(Refused) as refused:  # another tenant: read afresh, then refused
            await release(svc, As(pems["team-b"]), second.grant)
        assert refused.value.reason == "WRONG_TENANT" and store.bindings_read == read + 1
    finally:
        await store.close()


@run_async
async def test_a_kept_binding_reaches_no_record_of_another_tenant_after_a_restore(
        etcd: EtcdServer, prefix: str, pems: dict[str, bytes]) -> None:
    """An etcd restored from a backup taken before the id was made, then made by team-b: the
    replica still keeps team-a's binding, and team-a's calls admitted by it act on nothing of b's
    (WatchSessions judges every record it would show, as tests/integration/test_tenants.py checks)."""
    store = Store(open_channel(etcd.url), prefix)
    svc, a, b = CoordinatorService(store), As(pems["team-a"]), As(pems["team-b"])
    try:
        sid = "sess-race-restored"
        await register(svc, HOST)
        granted = await acquire(svc, a, sid, HOST)
        await release(svc, a, granted.grant)  # team-a's binding kept
        key = store.key("sessions", sid)
        await store.txn([], [], delete_prefixes=[prefix])  # the restore: nothing of it is left
        await register(svc, HOST)
        theirs = await acquire(svc, b, sid, HOST)  # a kept binding that would refuse is read again
        assert theirs.record.tenant == "team-b"
        before = await store.get(key)
        for attempt in (acquire(svc, a, sid, HOST), release(svc, a, theirs.grant)):
            with pytest.raises(Refused) as refused:
                await attempt
            assert refused.value.reason == "WRONG_TENANT"
        assert await store.get(key) == before, "nothing written on team-b's session"
    finally:
        await store.close()
