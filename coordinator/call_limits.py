"""How many long-lived calls one caller and one tenant keep open on this replica: the streams (Hold,
WatchSessions) and Acquire, which may wait (`run --wait`, a takeover waiting for the owner's exit).
Each holds coordinator memory for as long as it is open, and a caller chooses how long: with no
limit, one tenant's certificate could hold calls open until the replica failed every tenant.

A caller is its verified certificate (by its SHA-256) from one peer address, without TLS the peer
address alone (its port left out: a caller opens as many connections as it likes). Both, not the
certificate alone: a tenant's client certificate is usually one file copied to every node of the
tenant (`certs issue --out team-a/`), so the certificate alone would be the whole tenant; from one
address it is one node's, or one pod's, use of it. A tenant is the certificate's; an all-tenants
operator, an infrastructure role and a plaintext caller count against no tenant.

Guarantee: a call past either limit is refused TOO_MANY_CALLS before its handler reads anything,
asks an agent or writes (the refusal writes nothing and signals nothing), with a message naming the
limit, its setting and what to do; an admitted call holds its slot until it ends, however it ends —
answered, refused, failed, cancelled by its caller, past its deadline, its connection lost — for the
slot is given back in the `finally` of the handler that took it. A connection has at most
`streams_per_connection` calls open at once (HTTP/2 MAX_CONCURRENT_STREAMS, what the coordinator's
server is started with): a stream costs the replica ~20 KB from its headers on, before any handler
or this count sees it, and a client that sends headers and never its request held 20,000 of them
on one connection (+419 MiB) with no limit. A stream past it is refused (RST_STREAM REFUSED_STREAM)
before any handler runs; a gRPC client does not send it but waits for one of its streams to end.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from holdfast.common.reasons import Reason
from holdfast.coordinator.errors import CoordinatorError

if TYPE_CHECKING:  # the CLI reads the defaults: no metrics imported for them
    from holdfast.coordinator import tenancy

# One caller: a node's runs, each one call for its life (its Hold), two while a `run --wait` waits;
# a large node runs a few hundred sessions. Past it, runs of one certificate from one address.
PER_CALLER = 4096
# One tenant on one replica: thousands of sessions across nodes, each one call, spread over the
# replicas (or all on one while the others are down). A call waiting on a quiet watch costs the
# replica tens of KB; a WatchSessions stalled mid-listing holds a page (store.PAGE_BYTES, 256 KiB,
# or one record larger than that) and what gRPC buffers for a client that does not read: 1-2 MB a
# call for records at the cap, as measured (their unread watch events are bounded apart:
# watch_unread_budget_bytes).
PER_TENANT = 16384


@dataclass(frozen=True)
class CallLimits:
    per_caller: int = PER_CALLER
    per_tenant: int = PER_TENANT


DEFAULT_CALL_LIMITS = CallLimits()
# A connection's short calls beside its long-lived ones (commits, releases, fenced writes and reads
# of a node's runs): past them a call waits at the client for a stream, it is not refused.
SHORT_CALLS_PER_CONNECTION = 256


def streams_per_connection(limits: CallLimits) -> int:
    """A connection's most calls open at once: every long-lived call its caller may have, so the
    one past the caller's limit is refused TOO_MANY_CALLS, not left waiting for a stream for ever,
    and the short calls beside them."""
    return limits.per_caller + SHORT_CALLS_PER_CONNECTION


def caller_key(context: grpc.aio.ServicerContext) -> str:
    """The verified certificate's SHA-256 and the peer's address without its port; the address alone
    on a plaintext link."""
    peer = context.peer()
    kind, _, rest = peer.partition(":")
    address = f"{kind}:{rest.rpartition(':')[0]}" if kind in ("ipv4", "ipv6") else peer
    pems = context.auth_context().get("x509_pem_cert", [])
    return f"certificate {hashlib.sha256(pems[0]).hexdigest()[:16]} from {address}" if pems else address


class OpenCalls:
    """This replica's long-lived calls, counted by caller and by tenant."""

    def __init__(self, limits: CallLimits) -> None:
        self.limits = limits
        self._callers: collections.Counter[str] = collections.Counter()
        self._tenants: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def slot(self, rpc: str, context: grpc.aio.ServicerContext, who: tenancy.Caller) -> Iterator[None]:
        """One slot of the caller's and its tenant's, for the `with` block; TOO_MANY_CALLS when
        either has none left."""
        caller = caller_key(context)
        tenant = "" if who.all_tenants else who.tenant
        if self._callers[caller] >= self.limits.per_caller:
            raise self._refusal(rpc, f"this caller ({caller}, {who.who})", self.limits.per_caller,
                                "calls_per_caller_max")
        if tenant and self._tenants[tenant] >= self.limits.per_tenant:
            raise self._refusal(rpc, f"tenant {tenant}", self.limits.per_tenant, "calls_per_tenant_max")
        self._callers[caller] += 1
        self._tenants[tenant] += 1
        try:
            yield
        finally:
            for counts, key in ((self._callers, caller), (self._tenants, tenant)):
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]

    @staticmethod
    def _refusal(rpc: str, whose: str, limit: int, setting: str) -> CoordinatorError:
        return CoordinatorError(Reason.TOO_MANY_CALLS, (
            f"{rpc} refused: {whose} already has {limit} streaming or waiting calls (Hold, "
            f"WatchSessions, Acquire) open on this coordinator, its limit (the coordinator setting "
            f"{setting}). End the ones left open (a stalled `holdfast watch`, runs still waiting) or "
            "raise the setting, then retry; nothing was read or written"))
