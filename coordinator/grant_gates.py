"""The gates of a grant to a host: no restore pending, the host registered, the host not draining.

Guarantee: a `GrantGates` is the three keys as one decision read them, frozen: it is read once per
decision (in the decision's one round trip), judged from that reading, and every transaction that
rests on it (the grant, a takeover's handoff request, a force-pending) compares `reads`, so a gate
that closes after the reading makes that transaction lose, never pass. A closed gate refuses with
its reason and nothing written. `taken_open` is the gates without a round trip, for a grant alone:
a gate it takes as open but etcd holds closed makes that grant lose, and the refusal is a fresh
reading's.
"""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.common.reasons import Reason
from holdfast.coordinator import keys
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.registry import Registry, decode
from holdfast.coordinator.store import Seen, Store
from holdfast.v1 import coordinator_pb2 as pb


@dataclass(frozen=True)
class GrantGates:
    host_id: str
    registration: Seen  # from the registry's followed cache when it holds it, else etcd
    drain: Seen
    restore: Seen

    @property
    def reads(self) -> list[Seen]:
        return [self.registration, self.drain, self.restore]

    def judge(self) -> pb.HostRegistration:
        """The host's registration, or the first gate closed refused."""
        if self.restore.entry is not None:
            why = self.restore.entry.value.decode(errors="replace")[:200]
            raise CoordinatorError(Reason.RESTORE_PENDING, "etcd was restored from a backup and "
                                   f"restore-epoch has not finished ({why}); no grants until it has")
        host = decode(self.registration)
        if host is None:
            raise CoordinatorError(Reason.HOST_NOT_REGISTERED,
                                   f"host {self.host_id} has no live agent registration")
        if self.drain.entry is not None:
            raise CoordinatorError(Reason.HOST_DRAINING, f"host {self.host_id} is draining; no grants there")
        return host


async def read(store: Store, registry: Registry, host_id: str, *also: str) -> tuple[GrantGates, list[Seen]]:
    """The gates and the keys `also`, in one round trip: a grant is on every client's start path."""
    cached = registry.cached(host_id)
    wanted = [*also, keys.draining(store, host_id), keys.restore_pending(store)]
    if cached is None:
        wanted.append(registry.key_of(host_id))
    got = await store.read_all(wanted)
    drain, restore = got[len(also)], got[len(also) + 1]
    registration = cached if cached is not None else got[-1]
    return GrantGates(host_id, registration, drain, restore), got[: len(also)]


def taken_open(store: Store, registry: Registry, host_id: str) -> GrantGates | None:
    """The gates as they are when open, with no round trip: the host's registration from the
    followed cache, the drain flag and the restore gate absent; None when the cache does not hold the
    registration. Only a grant may rest on it: its transaction compares the registration's mod
    revision and the other two absent, so it applies only while a fresh read would find them so."""
    registration = registry.cached(host_id)
    if registration is None:
        return None
    return GrantGates(host_id, registration, Seen(keys.draining(store, host_id), None),
                      Seen(keys.restore_pending(store), None))
