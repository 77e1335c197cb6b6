"""The etcd keyspace: one function per key kind, so every key the coordinator reads or writes is
spelled here and nowhere else (docs/design.md §3 lists the same kinds; tests/unit/test_keys.py holds
the two together).

Guarantee: every key is `<store prefix><kind>/…` for one of `KINDS`; a prefix built here ends in
`/`, so listing or deleting one session's keys never reaches a session whose id merely starts with
the same letters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from holdfast.common.tls import TENANT

if TYPE_CHECKING:
    from holdfast.coordinator.store import Store

SESSIONS = "sessions"
FENCE = "fence"
HOSTS = "hosts"
HISTORY = "history"
DATA = "data"
OPS = "ops"
ARCHIVE = "archive"
DRAINING = "draining"
RESTORE_PENDING = "restore-pending"      # while it exists, Acquire refuses RESTORE_PENDING
NEW_SESSION_FLOOR = "new-session-floor"
CLUSTER_ID = "cluster-id"
CARRY = "carry"
CARRY_BUDGET = "carry-budget"
HOST_LAST = "host-last"          # a host's last registration, without a lease: read after it lapsed
FENCE_PENDING = "fence-pending"  # one fence of a host at a time; while it exists, RegisterHost refuses
FENCED = "fenced"                # the proof that a host's incarnation is off
FENCE_HISTORY = "fence-history"  # every fence attempt of a host (capped)
RESTORE_HOST_OFF = "restore-host-off"  # an operator's word that a host is off, for the restore under way

KINDS = (SESSIONS, FENCE, HOSTS, HISTORY, DATA, OPS, ARCHIVE, DRAINING, RESTORE_PENDING,
         NEW_SESSION_FLOOR, CLUSTER_ID, CARRY, CARRY_BUDGET, HOST_LAST, FENCE_PENDING, FENCED, FENCE_HISTORY,
         RESTORE_HOST_OFF)


def session(store: Store, sid: str) -> str:
    return store.key(SESSIONS, sid)


def sessions_prefix(store: Store) -> str:
    return store.key(SESSIONS, "")


def fence(store: Store, sid: str) -> str:
    return store.key(FENCE, sid)


def host(store: Store, host_id: str) -> str:
    return store.key(HOSTS, host_id)


def hosts_prefix(store: Store) -> str:
    return store.key(HOSTS, "")


def history(store: Store, sid: str, seq: int) -> str:
    """Zero-padded, so key order is sequence order."""
    return store.key(HISTORY, sid, f"{seq:020d}")


def history_prefix(store: Store, sid: str) -> str:
    return store.key(HISTORY, sid, "")


def data(store: Store, sid: str, data_key: str) -> str:
    return store.key(DATA, sid, data_key)


def data_prefix(store: Store, sid: str) -> str:
    return store.key(DATA, sid, "")


def op(store: Store, sid: str, op_hash: str) -> str:
    return store.key(OPS, sid, op_hash)


def ops_prefix(store: Store, sid: str) -> str:
    return store.key(OPS, sid, "")


def archive_record(store: Store, sid: str) -> str:
    return store.key(ARCHIVE, sid, "record")


def archive_history(store: Store, sid: str, seq_part: str) -> str:
    """`seq_part`: the last part of the live history key it was archived from."""
    return store.key(ARCHIVE, sid, HISTORY, seq_part)


def archive_history_prefix(store: Store, sid: str) -> str:
    return store.key(ARCHIVE, sid, HISTORY, "")


def archives_prefix(store: Store) -> str:
    return store.key(ARCHIVE, "")


def draining(store: Store, host_id: str) -> str:
    return store.key(DRAINING, host_id)


def draining_prefix(store: Store) -> str:
    return store.key(DRAINING, "")


def restore_pending(store: Store) -> str:
    return store.key(RESTORE_PENDING)


def restore_host_off(store: Store, host_id: str) -> str:
    return store.key(RESTORE_HOST_OFF, host_id)


def restore_host_off_prefix(store: Store) -> str:
    return store.key(RESTORE_HOST_OFF, "")


def new_session_floor(store: Store) -> str:
    return store.key(NEW_SESSION_FLOOR)


def cluster_id(store: Store) -> str:
    return store.key(CLUSTER_ID)


def carry_prefix(store: Store, sid: str) -> str:
    return store.key(CARRY, sid, "")


def carry_manifest(store: Store, sid: str) -> str:
    return store.key(CARRY, sid, "manifest")


def carry_slot(store: Store, sid: str, slot: int) -> str:
    return store.key(CARRY, sid, "slot", str(slot))


def carry_chunk(store: Store, sid: str, slot: int, index: int) -> str:
    return store.key(CARRY, sid, "chunk", str(slot), f"{index:05d}")


def carry_chunks_prefix(store: Store, sid: str, slot: int) -> str:
    return store.key(CARRY, sid, "chunk", str(slot), "")


def carry_budget(store: Store) -> str:
    return store.key(CARRY_BUDGET)


def carry_tenant_budget(store: Store, tenant: str) -> str:
    """A tenant's share of the carry budget. Only a tenant name (a DNS label: no `/`, never empty)
    is taken, so no record or slot naming something else can address a key outside `carry-budget/`."""
    if not TENANT.fullmatch(tenant):
        raise ValueError(f"{tenant[:80]!r} is not a tenant: a DNS label ({TENANT.pattern})")
    return store.key(CARRY_BUDGET, tenant)


def carry_tenant_budgets_prefix(store: Store) -> str:
    return store.key(CARRY_BUDGET, "")


def host_last(store: Store, host_id: str) -> str:
    return store.key(HOST_LAST, host_id)


def host_last_prefix(store: Store) -> str:
    return store.key(HOST_LAST, "")


def fence_pending(store: Store, host_id: str) -> str:
    return store.key(FENCE_PENDING, host_id)


def fence_pending_prefix(store: Store) -> str:
    return store.key(FENCE_PENDING, "")


def fenced(store: Store, host_id: str) -> str:
    return store.key(FENCED, host_id)


def fenced_prefix(store: Store) -> str:
    return store.key(FENCED, "")


def fence_history(store: Store, host_id: str, seq: int) -> str:
    """Zero-padded, so key order is attempt order."""
    return store.key(FENCE_HISTORY, host_id, f"{seq:020d}")


def fence_history_prefix(store: Store, host_id: str) -> str:
    return store.key(FENCE_HISTORY, host_id, "")
