"""Sessions belong to their tenant, over mTLS with a real etcd, coordinator, agent and `holdfast run`.

Tenant a's session runs a real CMD. Every session RPC by tenant b's runtime is refused WRONG_TENANT
with etcd byte-identical, no agent asked (the coordinator's routed probes and the agent's own
counters unchanged) and a's CMD untouched — a forced takeover from b kills nothing. Listings and
watches never show b a's session. A scoped operator is refused on a's session and on host-wide
calls; an all-tenants operator is not. A record written before tenants is the default tenant's, and
an archived or purged id stays its tenant's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from holdfast.common import certs, tls
from holdfast.common.reasons import reason_of
from holdfast.common.tls import Role
from holdfast.coordinator import records
from holdfast.coordinator.store import Put, Store, etcd_credentials
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc
from tests.integration.conftest import AgentProcess
from tests.integration.coordinator_fixtures import Coordinator, etcd_server, snapshot
from tests.integration.run_fixtures import until

pytest_plugins = ["tests.integration.coordinator_fixtures"]
pytestmark = [pytest.mark.timeout(180), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read other processes' environments")]
CALLERS = {"team-a": Role("client", "", "team-a"), "team-b": Role("client", "", "team-b"),
           "op-b": Role("operator", "", "team-b"), "op-all": Role("operator", "", "*")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(tmp_path_factory.mktemp("pki-tenants"))
    certs.init_local(base / "ca", ["host-a"], ["127.0.0.1", "localhost"])
    for name, role in CALLERS.items():
        certs.issue_one(base / "ca", role, [], base / name)
    return base


@pytest.fixture(scope="module")
def etcd_tls(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[EtcdServer]:
    yield from etcd_server(tmp_path_factory, pki / "ca" / "etcd")


@pytest.fixture
def stack(etcd_tls: EtcdServer, tmp_path: Path, prefix: str, pki: Path,
          request: pytest.FixtureRequest) -> Iterator[tuple[Coordinator, Path]]:
    """The coordinator (with the flags a test parametrizes it with, indirect) and host-a's agent."""
    coordinator = Coordinator(etcd_tls.url, tmp_path, prefix, args=(
        "--tls-dir", str(pki / "ca"), "--metrics-listen", "127.0.0.1:0",
        *getattr(request, "param", ()))).start()
    agent = AgentProcess(tmp_path, "host-a", args=[
        "--tls-dir", str(pki / "ca"), "--coordinator", coordinator.address,
        "--metrics-listen", "127.0.0.1:0"])
    try:
        until("host-a registered", lambda: any(
            h.host_id == "host-a" for h in as_(coordinator, pki, "op-all").ListHosts(
                pb.ListHostsRequest(), timeout=5).hosts))
        yield coordinator, tmp_path
    finally:
        agent.stop()
        coordinator.stop()


def as_(coordinator: Coordinator, pki: Path, who: str) -> coordinator_pb2_grpc.CoordinatorStub:
    directory = pki / who if who in CALLERS else pki / "ca"
    role = Role(CALLERS[who].kind if who in CALLERS else "client")
    return coordinator_pb2_grpc.CoordinatorStub(
        tls.open_channel(coordinator.address, directory, role, sync=True))


def state(etcd: EtcdServer, prefix: str, pki: Path) -> list[tuple[str, bytes]]:
    return snapshot(etcd.url, prefix, etcd_credentials(etcd.url, pki / "ca" / "etcd"))


def agent_calls(coordinator: Coordinator, tmp: Path) -> dict[str, float]:
    """Every counter of what was asked of agents: the coordinator's routed probes and kills, and
    the agent's own probes, attestations, scans and exit watches."""
    agent_metrics = json.loads((tmp / "ready-host-a.json").read_text())["metrics"]
    counts = {}
    for address, wanted in ((coordinator.metrics, "holdfast_probes"), (agent_metrics, "holdfast_agent_")):
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(wanted) and re.match(r"\S+(_total|_count)(\{.*\})? ", line):
                name, value = line.rsplit(" ", 1)
                counts[f"{address} {name}"] = float(value)
    return counts


def wrong_tenant(call: Callable[..., object], request: object) -> None:
    with pytest.raises(grpc.RpcError) as err:
        result = call(request, timeout=10)
        if not hasattr(result, "SerializeToString"):
            next(iter(result))  # type: ignore[call-overload]
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value  # type: ignore[attr-defined]
    assert reason_of(err.value) == "WRONG_TENANT", err.value


def run(pki: Path, who: str, coordinator: Coordinator, tmp: Path, sid: str, *args: str,
        cmd: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HOLDFAST_COORDINATOR": coordinator.address, "HOLDFAST_HOST_ID": "host-a",
           "TMPDIR": str(tmp), "XDG_STATE_HOME": str(tmp / f"state-{who}")}
    return subprocess.Popen([sys.executable, "-m", "holdfast.cli", "run", "--session", sid, "--tls-dir",
                             str(pki / who), *args, "--", *cmd], env=env, cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def put_raw(etcd: EtcdServer, prefix: str, pki: Path, value: bytes, *parts: str) -> None:
    """`value` written straight into etcd at the key of `parts`, past every check."""
    async def put() -> None:
        store = Store.connect(etcd.url, etcd_credentials(etcd.url, pki / "ca" / "etcd"), prefix=prefix)
        try:
            assert (await store.txn([], [Put(store.key(*parts), value)]))[0]
        finally:
            await store.close()

    asyncio.run(put())


def rewrite(etcd: EtcdServer, prefix: str, pki: Path, record: pb.SessionRecord) -> None:
    """`record` written straight into etcd, past every check."""
    put_raw(etcd, prefix, pki, records.encode(record), "sessions", record.session_id)


def acquire(stub: coordinator_pb2_grpc.CoordinatorStub, sid: str, **fields: object) -> pb.AcquireResponse:
    return stub.Acquire(pb.AcquireRequest(session_id=sid, operation_id=os.urandom(16).hex(), host_id="host-a",
                                          **fields), timeout=30)  # type: ignore[arg-type]


def test_another_tenant_is_refused_on_every_rpc_and_changes_nothing(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    coordinator, tmp = stack
    sid = "sess-tenant-a"
    owner = run(pki, "team-a", coordinator, tmp, sid,
                cmd=["sh", "-c", "echo $$ > owner.tmp && mv owner.tmp owner.pid; exec sleep 300"])
    try:
        until("team a's CMD running", (tmp / "owner.pid").exists)
        pid = int((tmp / "owner.pid").read_text())
        a, b = as_(coordinator, pki, "team-a"), as_(coordinator, pki, "team-b")
        own = acquire(b, "sess-tenant-b")  # b's own session: its listings are not empty
        record = a.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record
        assert record.tenant == "team-a" and record.lease.claim_status in (pb.COMMITTED, pb.LIVE)
        fence, op = record.lease.fence, os.urandom(16).hex()
        before, calls = state(etcd_tls, prefix, pki), agent_calls(coordinator, tmp)

        grant = dict(session_id=sid, fence=fence, secret="0" * 64)
        for call, request in [
            (b.Acquire, pb.AcquireRequest(session_id=sid, operation_id=op, host_id="host-a")),
            (b.Acquire, pb.AcquireRequest(session_id=sid, operation_id=op, host_id="host-a", takeover=True)),
            (b.Acquire, pb.AcquireRequest(session_id=sid, operation_id=op, host_id="host-a", takeover=True,
                                          force=True)),
            (b.Acquire, pb.AcquireRequest(session_id=sid, operation_id=op, host_id="host-a", wait_seconds=5)),
            (b.RequestHandoff, pb.RequestHandoffRequest(session_id=sid, operation_id=op, host_id="host-a")),
            (b.CommitOwner, pb.CommitOwnerRequest(**grant)),
            (b.Release, pb.ReleaseRequest(**grant)),
            (b.RecordProviderHandle, pb.RecordProviderHandleRequest(**grant, handle="h")),
            (b.FencedPut, pb.FencedPutRequest(**grant, key="k", value=b"v")),
            (b.FencedGet, pb.FencedGetRequest(session_id=sid, key="k")),
            (b.BeginCarry, pb.BeginCarryRequest(**grant, total_bytes=1, chunks=1)),
            (b.PutCarryChunk, pb.PutCarryChunkRequest(**grant, slot=0, index=0, data=b"x")),
            (b.CommitCarry, pb.CommitCarryRequest(**grant)),
            (b.GetCarry, pb.GetCarryRequest(session_id=sid)),
            (b.ProbeSession, pb.ProbeSessionRequest(session_id=sid)),
            (b.GetSession, pb.GetSessionRequest(session_id=sid)),
            (b.GetArchivedSession, pb.GetArchivedSessionRequest(session_id=sid)),
            (b.WatchSessions, pb.WatchSessionsRequest(session_id=sid)),
            (b.WatchSessions, pb.WatchSessionsRequest(session_id=sid, after_revision=1)),  # a's history
        ]:
            wrong_tenant(call, request)
        taker = run(pki, "team-b", coordinator, tmp, sid, "--takeover", "--force", cmd=["true"])
        _, err = taker.communicate(timeout=60)
        assert taker.returncode == 77 and b"WRONG_TENANT" in err, err
        op_b = as_(coordinator, pki, "op-b")
        wrong_tenant(op_b.Recover, pb.RecoverRequest(session_id=sid, expected_fence=fence, operator="o",
                                                     reason="r"))
        wrong_tenant(op_b.ArchiveSession, pb.ArchiveSessionRequest(session_id=sid, expected_fence=fence,
                                                                   operator="o", reason="r"))
        wrong_tenant(op_b.DrainHost, pb.DrainHostRequest(host_id="host-a", draining=True, operator="o"))
        wrong_tenant(op_b.RestoreEpoch, pb.RestoreEpochRequest(operator="o", reason="r"))

        assert state(etcd_tls, prefix, pki) == before, "nothing written"
        assert agent_calls(coordinator, tmp) == calls, "no agent asked"
        os.kill(pid, 0)  # a's CMD still runs: nothing was signalled
        assert owner.poll() is None

        # b's listings and watches show its own session, never a's; a's and an all-tenants operator's do.
        listed = {r.session_id for r in b.ListSessions(pb.ListSessionsRequest(), timeout=10).records}
        assert own.grant.session_id in listed and sid not in listed
        seen = []
        for event in b.WatchSessions(pb.WatchSessionsRequest(), timeout=30):
            seen.append(event.record.session_id)
            if event.record.session_id == own.grant.session_id:
                break
        assert sid not in seen, "sorted before b's own, a's session would have come first"
        for who in ("team-a", "op-all"):
            assert sid in {r.session_id for r in as_(coordinator, pki, who).ListSessions(
                pb.ListSessionsRequest(), timeout=10).records}
        as_(coordinator, pki, "op-all").GetSession(pb.GetSessionRequest(session_id=sid), timeout=10)
    finally:
        owner.send_signal(signal.SIGTERM)
        owner.wait(30)


def test_a_listing_page_token_names_only_sessions_shown(
    stack: tuple[Coordinator, Path], pki: Path
) -> None:
    coordinator, _ = stack
    a, b = as_(coordinator, pki, "team-a"), as_(coordinator, pki, "team-b")
    for sid in ("sess-page-a1", "sess-page-a2", "sess-page-c"):
        acquire(a, sid)
    acquire(b, "sess-page-b")

    def pages(stub: coordinator_pb2_grpc.CoordinatorStub) -> tuple[list[str], list[str]]:
        shown, tokens, token = [], [], ""
        while True:  # one record at a time through all the caller may see
            page = stub.ListSessions(pb.ListSessionsRequest(page_size=1, page_token=token), timeout=10)
            shown += [r.session_id for r in page.records]
            token = page.next_page_token
            if not token:
                return shown, tokens
            tokens.append(token)

    shown, tokens = pages(b)
    assert shown == ["sess-page-b"] and tokens == [], f"a token names another tenant's session: {tokens}"
    everything = ["sess-page-a1", "sess-page-a2", "sess-page-b", "sess-page-c"]
    assert pages(as_(coordinator, pki, "op-all")) == (everything, everything[:-1])


def test_a_record_from_before_tenants_is_the_default_tenants(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    coordinator, _ = stack
    plain = as_(coordinator, pki, "default")  # ca/client.pem names no tenant
    sid = "sess-tenant-old"
    granted = acquire(plain, sid)
    assert granted.record.tenant == "default"
    old = granted.record
    old.ClearField("tenant")  # as a coordinator before tenants wrote it
    rewrite(etcd_tls, prefix, pki, old)
    assert plain.GetSession(pb.GetSessionRequest(session_id=sid), timeout=10).record.tenant == ""
    before = state(etcd_tls, prefix, pki)
    a = as_(coordinator, pki, "team-a")
    wrong_tenant(a.GetSession, pb.GetSessionRequest(session_id=sid))
    wrong_tenant(a.Acquire, pb.AcquireRequest(session_id=sid, operation_id=os.urandom(16).hex(),
                                              host_id="host-a"))
    assert state(etcd_tls, prefix, pki) == before


def test_an_archived_or_purged_id_stays_its_tenants(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    coordinator, _ = stack
    a, b, op = (as_(coordinator, pki, who) for who in ("team-a", "team-b", "op-all"))
    sid = "sess-tenant-archived"
    granted = acquire(a, sid)
    a.Release(pb.ReleaseRequest(session_id=sid, fence=granted.grant.fence, secret=granted.grant.secret,
                                cluster_id=granted.grant.cluster_id), timeout=10)
    op.ArchiveSession(pb.ArchiveSessionRequest(session_id=sid, expected_fence=granted.grant.fence,
                                               operator="o", reason="done"), timeout=10)
    wrong_tenant(b.Acquire, pb.AcquireRequest(session_id=sid, operation_id=os.urandom(16).hex(),
                                              host_id="host-a"))
    wrong_tenant(b.GetArchivedSession, pb.GetArchivedSessionRequest(session_id=sid))
    maintenance = coordinator_pb2_grpc.CoordinatorStub(
        tls.open_channel(coordinator.address, pki / "ca", Role("maintenance"), sync=True))
    maintenance.PurgeArchives(pb.PurgeArchivesRequest(older_than_seconds=0, limit=100), timeout=10)
    wrong_tenant(b.Acquire, pb.AcquireRequest(session_id=sid, operation_id=os.urandom(16).hex(),
                                              host_id="host-a"))
    again = acquire(a, sid)
    assert again.record.tenant == "team-a" and again.grant.fence > granted.grant.fence


def test_a_scoped_operators_recover_host_answers_and_changes_nothing_of_another_tenant(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    """The host holds a session of team a and one of team b: b's operator frees b's alone, and its
    answer is the one it would get were a's not there (it once counted the others it skipped)."""
    coordinator, _ = stack
    gone = "host-gone-tenants"  # a node gone for good: no registration, so recover-host may act
    granted = {}
    for who, sid in (("team-a", "sess-rh-a"), ("team-b", "sess-rh-b")):
        record = acquire(as_(coordinator, pki, who), sid).record
        assert record.lease.claim_status == pb.RESERVED
        record.lease.reserved_host_id = gone  # reserved there before the node went
        rewrite(etcd_tls, prefix, pki, record)
        granted[sid] = record.lease.fence

    def a_keys() -> list[tuple[str, bytes]]:
        return [(k, v) for k, v in state(etcd_tls, prefix, pki) if "sess-rh-a" in k]

    before = a_keys()
    request = pb.RecoverHostRequest(host_id=gone, operator="o", reason="node gone")
    scoped = as_(coordinator, pki, "op-b").RecoverHost(request, timeout=10)
    assert scoped == pb.RecoverHostResponse(results=[pb.RecoverHostResult(
        session_id="sess-rh-b", fence=granted["sess-rh-b"], recovered=True)]), scoped
    assert a_keys() == before, "another tenant's session changed"
    everyone = as_(coordinator, pki, "op-all").RecoverHost(request, timeout=10)
    assert everyone == pb.RecoverHostResponse(results=[pb.RecoverHostResult(
        session_id="sess-rh-a", fence=granted["sess-rh-a"], recovered=True)]), everyone


def test_only_an_all_tenants_operators_recover_host_declares_a_node_off_for_a_restore(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    """While a restore is pending, recover-host's word also counts the node as searched for it
    (restore-epoch): a scoped operator frees its own sessions there and declares nothing, since one
    tenant cannot vouch for a node every tenant's sessions may have used."""
    coordinator, _ = stack
    gone = "host-gone-restore"
    record = acquire(as_(coordinator, pki, "team-b"), "sess-rh-restore").record
    record.lease.reserved_host_id = gone
    rewrite(etcd_tls, prefix, pki, record)
    put_raw(etcd_tls, prefix, pki, b"restored snap.db", "restore-pending")

    def declared() -> list[str]:
        return [k for k, _ in state(etcd_tls, prefix, pki) if k.endswith(f"restore-host-off/{gone}")]

    request = pb.RecoverHostRequest(host_id=gone, operator="o", reason="node gone")
    scoped = as_(coordinator, pki, "op-b").RecoverHost(request, timeout=10)
    assert [r.recovered for r in scoped.results] == [True] and declared() == []
    as_(coordinator, pki, "op-all").RecoverHost(request, timeout=10)
    assert len(declared()) == 1


def test_a_scoped_operator_purges_only_its_tenants_archives(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    coordinator, _ = stack
    op_b, op = as_(coordinator, pki, "op-b"), as_(coordinator, pki, "op-all")
    for who, sid in (("team-a", "sess-purge-a"), ("team-b", "sess-purge-b")):
        runtime = as_(coordinator, pki, who)
        granted = acquire(runtime, sid).grant
        runtime.Release(pb.ReleaseRequest(session_id=sid, fence=granted.fence, secret=granted.secret,
                                          cluster_id=granted.cluster_id), timeout=10)
        op.ArchiveSession(pb.ArchiveSessionRequest(session_id=sid, expected_fence=granted.fence, operator="o",
                                                   reason="done"), timeout=10)
    a_archive = [(k, v) for k, v in state(etcd_tls, prefix, pki) if "sess-purge-a" in k]
    purged = op_b.PurgeArchives(pb.PurgeArchivesRequest(older_than_seconds=0, limit=100), timeout=10).purged
    assert list(purged) == ["sess-purge-b"], "another tenant's archive purged, or its id told"
    assert [(k, v) for k, v in state(etcd_tls, prefix, pki) if "sess-purge-a" in k] == a_archive
    assert list(op.PurgeArchives(pb.PurgeArchivesRequest(older_than_seconds=0, limit=100),
                                 timeout=10).purged) == ["sess-purge-a"]


def test_an_agent_or_maintenance_certificate_acts_on_no_tenants_sessions(
    stack: tuple[Coordinator, Path], pki: Path
) -> None:
    coordinator, _ = stack
    sid = "sess-default-infra"
    acquire(as_(coordinator, pki, "default"), sid)  # the default tenant's, as every record before tenants
    for role in (Role("agent", "host-a"), Role("maintenance")):
        # Keys on every node (the agent CA mints them) and the retention job's: neither calls a
        # session RPC, so neither, stolen, reads a session, its data or its carried files.
        stub = coordinator_pb2_grpc.CoordinatorStub(tls.open_channel(coordinator.address, pki / "ca", role,
                                                                     sync=True))
        wrong_tenant(stub.GetSession, pb.GetSessionRequest(session_id=sid))
        wrong_tenant(stub.FencedGet, pb.FencedGetRequest(session_id=sid, key="k"))
        wrong_tenant(stub.GetCarry, pb.GetCarryRequest(session_id=sid))
        assert not stub.ListSessions(pb.ListSessionsRequest(), timeout=10).records, role
        assert stub.ListHosts(pb.ListHostsRequest(), timeout=10).hosts, role


def test_a_certificate_of_no_tenant_creates_no_session(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    coordinator, _ = stack
    # A kind no rule gives a tenant (an etcd certificate signed by the cluster's CA) acts for none.
    etcd_role = pki / "etcd-role"
    if not etcd_role.exists():
        certs.issue_one(pki / "ca", Role("etcd"), [], etcd_role)
    before = state(etcd_tls, prefix, pki)
    for role, directory in ((Role("coordinator"), pki / "ca"), (Role("agent", "host-a"), pki / "ca"),
                            (Role("maintenance"), pki / "ca"), (Role("etcd"), etcd_role)):
        # A record naming no tenant reads as the default tenant's: a stolen infrastructure key
        # granted an unseen id would squat one of the default tenant's ids.
        stub = coordinator_pb2_grpc.CoordinatorStub(tls.open_channel(coordinator.address, directory, role,
                                                                     sync=True))
        with pytest.raises(grpc.RpcError) as err:
            acquire(stub, f"sess-unseen-{role.kind}")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (role, err.value)  # type: ignore[attr-defined]
        # Read of an unseen id: refused alike, so a refusal tells it nothing of which ids exist.
        wrong_tenant(stub.GetSession, pb.GetSessionRequest(session_id=f"sess-unseen-{role.kind}"))
    assert state(etcd_tls, prefix, pki) == before


def test_a_replayed_grant_goes_back_to_its_own_certificate_alone(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    """The same operation id from another certificate on the same address is another operation: it
    never gets the first caller's grant and secret back (the replay key names the certificate)."""
    coordinator, _ = stack
    operation = os.urandom(16).hex()
    ask = pb.AcquireRequest(session_id="sess-replay-own", operation_id=operation, host_id="host-a")
    granted = as_(coordinator, pki, "team-b").Acquire(ask, timeout=30)
    assert granted.grant.secret
    assert as_(coordinator, pki, "team-b").Acquire(ask, timeout=30).grant.secret == granted.grant.secret
    before = state(etcd_tls, prefix, pki)
    with pytest.raises(grpc.RpcError) as err:
        as_(coordinator, pki, "op-b").Acquire(ask, timeout=30)  # the same tenant, another role
    assert reason_of(err.value) == "RESERVED", err.value
    assert state(etcd_tls, prefix, pki) == before


def _cert(pki: Path, who: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate((pki / who / f"{CALLERS[who].kind}.pem").read_bytes())


def test_a_certificate_names_one_tenant_or_gets_no_role(pki: Path, tmp_path: Path) -> None:
    assert tls.role_of_certificate(_cert(pki, "team-a")) == Role("client", "", "team-a")
    assert tls.role_of_certificate(_cert(pki, "op-all")) == Role("operator", "", "*")
    ca_key, ca_cert = certs.load_ca(pki / "ca")
    key = certs._new_key()  # a certificate no `certs issue` would write

    def with_uris(*uris: str) -> x509.Certificate:
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        return certs._leaf(ca_key, ca_cert, "t", key.public_key(), names,
                           certs.LEAF_LIFETIME)

    for uris in (("holdfast://client", "holdfast-tenant://a", "holdfast-tenant://b"),  # two tenants
                 ("holdfast://client", "holdfast-tenant://Team_A"),                 # malformed
                 ("holdfast://client", "holdfast-tenant://"),
                 ("holdfast://client", "holdfast-tenant://*"),                      # all, on a runtime
                 # A scheme is case-blind (RFC 3986 §3.1): read as no tenant, this one's holder
                 # would act for the default tenant instead of team-a.
                 ("holdfast://client", "HOLDFAST-TENANT://team-a"),
                 ("holdfast://client", "Holdfast-Tenant://team-a"),
                 ("holdfast-tenant://team-a/", "holdfast://client")):              # not exactly one
        assert tls.role_of_certificate(with_uris(*uris)) is None, uris
    assert tls.role_of_certificate(with_uris("holdfast://client")) == Role("client")


@pytest.mark.parametrize("stack", [("--carry-tenant-budget-bytes", str(64 << 10), "--census-seconds", "0.2")],
                         indirect=True)
def test_a_tenant_filling_its_carry_budget_leaves_another_tenants_uploads_be(
    stack: tuple[Coordinator, Path], etcd_tls: EtcdServer, prefix: str, pki: Path
) -> None:
    coordinator, tmp = stack
    write = "head -c 40000 /dev/zero > {0}/f"

    def carried(who: str, sid: str) -> subprocess.Popen[bytes]:
        (tmp / sid).mkdir()
        return run(pki, who, coordinator, tmp, sid, "--carry", sid, cmd=["sh", "-c", write.format(sid)])

    def budget_keys() -> list[tuple[str, bytes]]:
        return [(k, v) for k, v in state(etcd_tls, prefix, pki) if "carry-budget" in k]

    first = carried("team-a", "sess-carry-a1")
    assert first.wait(60) == 0, first.stderr.read() if first.stderr else ""
    before = budget_keys()
    refused = carried("team-a", "sess-carry-a2")  # 40000 more bytes: past team a's 65536
    refused.wait(60)
    err = refused.stderr.read().decode() if refused.stderr else ""
    assert "CARRY_BUDGET_EXHAUSTED" in err and "tenant team-a" in err, err
    assert budget_keys() == before, "the refused upload moved no budget"
    assert not [k for k, _ in state(etcd_tls, prefix, pki) if "/carry/sess-carry-a2/" in k]
    other = carried("team-b", "sess-carry-b1")  # the cluster's 512 MiB are far from full
    assert other.wait(60) == 0, other.stderr.read() if other.stderr else ""
    shown = subprocess.run([sys.executable, "-m", "holdfast.cli", "show", "sess-carry-a1", "--json",
                            "--tls-dir", str(pki / "team-a")], capture_output=True, check=True,
                           env={**os.environ, "HOLDFAST_COORDINATOR": coordinator.address})
    assert json.loads(shown.stdout)["carry_budget"] == {
        "tenant": "team-a", "tenant_reserved_bytes": 40000, "tenant_budget_bytes": 64 << 10,
        "reserved_bytes": 80000, "budget_bytes": 512 << 20}

    def census() -> dict[str, float] | None:
        text = urllib.request.urlopen(f"http://{coordinator.metrics}/metrics", timeout=10).read().decode()
        found = dict(re.findall(r'^(holdfast_carry_\S+) (\S+)$', text, re.M))
        return found if found.get('holdfast_carry_tenant_reserved_bytes{tenant="team-b"}') else None

    gauges = until("the census of the carry budgets", census)
    assert gauges is not None
    assert {k: float(v) for k, v in gauges.items()} == {
        "holdfast_carry_reserved_bytes": 80000.0,
        'holdfast_carry_tenant_reserved_bytes{tenant="team-a"}': 40000.0,
        'holdfast_carry_tenant_reserved_bytes{tenant="team-b"}': 40000.0}
