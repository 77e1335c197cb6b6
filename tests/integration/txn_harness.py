"""White-box harness for the transaction tests: coordinator services run in this process over a real
etcd, and a store that lets a test change keys between a decision's reads and its transaction.

Two services over one etcd are two coordinator replicas: the `victim` decides, the `other` makes the
concurrent change. The pause is an awaited hook inside the victim's `txn`, so the change lands
exactly between read and write, with no sleep and no thread.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aetcd import rpc
from google.rpc import error_details_pb2, status_pb2

from holdfast.coordinator import records
from holdfast.coordinator.service import CoordinatorService
from holdfast.coordinator.store import Put, Store, open_channel
from holdfast.localstack.etcd_server import EtcdServer
from holdfast.v1 import coordinator_pb2 as pb

Hook = Callable[[], Awaitable[None]]
TOKEN_ENV = "HOLDFAST_SPAWN_TOKEN"


class Refused(Exception):
    """What a servicer's `abort_with_status` raises here: the reason of the refusal."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class Context:
    """The parts of a grpc.aio servicer context the coordinator uses, for a plaintext peer."""

    def __init__(self, peer: str = "ipv4:127.0.0.1:40000") -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort_with_status(self, status: object) -> None:
        details = dict(status.trailing_metadata).get("grpc-status-details-bin", b"")  # type: ignore[attr-defined]
        decoded = status_pb2.Status.FromString(details)
        for detail in decoded.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                raise Refused(info.reason, decoded.message)
        raise Refused("", decoded.message)


@dataclass
class Armed:
    when: Callable[[Sequence[Put], Sequence[str]], bool]
    hook: Hook


class InterferingStore(Store):
    """A store whose next matching transaction first awaits a hook (once), and that records whether
    each of its transactions was applied."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.armed: Armed | None = None
        self.results: list[tuple[bool, list[str]]] = []

    def arm(self, when: Callable[[Sequence[Put], Sequence[str]], bool], hook: Hook) -> None:
        self.armed = Armed(when, hook)

    async def txn(self, compares: Sequence[rpc.Compare], puts: Sequence[Put],
                  deletes: Sequence[str] = (), delete_prefixes: Sequence[str] = ()) -> tuple[bool, int]:
        armed = self.armed
        if armed is not None and armed.when(puts, deletes):
            self.armed = None
            await armed.hook()
        ok, revision = await super().txn(compares, puts, deletes, delete_prefixes)
        self.results.append((ok, [p.key for p in puts] + list(deletes)))
        return ok, revision

    def outcomes_for(self, key: str) -> list[bool]:
        """Whether each transaction that wrote `key` was applied, in order."""
        return [ok for ok, keys in self.results if key in keys]


def writes(key: str) -> Callable[[Sequence[Put], Sequence[str]], bool]:
    return lambda puts, deletes: any(p.key == key for p in puts) or key in deletes


@dataclass
class Pair:
    """Two coordinator replicas over one etcd prefix."""

    victim: CoordinatorService
    other: CoordinatorService
    ctx: Context = field(default_factory=Context)

    @property
    def store(self) -> InterferingStore:
        assert isinstance(self.victim.store, InterferingStore)
        return self.victim.store

    def key(self, *parts: str) -> str:
        return self.victim.store.key(*parts)

    async def close(self) -> None:
        await self.victim.store.close()
        await self.other.store.close()


def pair(etcd: EtcdServer, prefix: str) -> Pair:
    return Pair(CoordinatorService(InterferingStore(open_channel(etcd.url), prefix)),
                CoordinatorService(Store(open_channel(etcd.url), prefix)))


async def register(svc: CoordinatorService, host_id: str, address: str = "127.0.0.1:9",
                   env: str = TOKEN_ENV, ttl: int = 60) -> int:
    """A registration; the address is dialed only when a decision needs that host's agent."""
    reg = pb.HostRegistration(host_id=host_id, address=address, spawn_token_env=env, agent_version="test")
    lease_id, _ = await svc.registry.register(reg, ttl)
    return lease_id


async def acquire(svc: CoordinatorService, ctx: Context, sid: str, host_id: str,
                  operation_id: str = "", **kw: object) -> pb.AcquireResponse:
    request = pb.AcquireRequest(session_id=sid, host_id=host_id,
                                operation_id=operation_id or secrets.token_hex(16), **kw)
    return await svc.Acquire(request, ctx)  # type: ignore[return-value]


async def release(svc: CoordinatorService, ctx: Context, grant: pb.Grant) -> pb.ReleaseResponse:
    request = pb.ReleaseRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret)
    return await svc.Release(request, ctx)  # type: ignore[return-value]


async def archive(svc: CoordinatorService, ctx: Context, sid: str, fence: int) -> pb.ArchiveSessionResponse:
    request = pb.ArchiveSessionRequest(session_id=sid, expected_fence=fence, operator="test", reason="race")
    return await svc.ArchiveSession(request, ctx)  # type: ignore[return-value]


async def record_of(svc: CoordinatorService, sid: str) -> pb.SessionRecord | None:
    entry = await svc.store.get(svc.store.key("sessions", sid))
    return records.decode_record(entry.value) if entry is not None else None


async def touch(store: Store, key: str) -> None:
    """Rewrites a key with its own bytes (and lease): only its mod revision changes."""
    entry = await store.get(key)
    assert entry is not None, key
    await store.txn([], [Put(key, entry.value, entry.lease)])


async def create(store: Store, key: str, value: bytes = b"1") -> None:
    """Puts a key a decision read as absent (b"1" is a valid floor, flag and gate alike)."""
    await store.txn([], [Put(key, value)])


async def delete(store: Store, key: str) -> None:
    await store.txn([], [], [key])
