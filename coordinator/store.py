"""The one module over aetcd: every etcd read, transaction, lease and watch goes through here.

Guarantee: the gRPC channel is opened here (several endpoints with round_robin, TLS optional —
aetcd's own `connect()` does neither, docs/design.md §7) and handed to aetcd's stubs; a write is one
etcd transaction, so it lands whole or not at all; an unreachable etcd is `StoreUnavailable`, never
a partial write and never a silent success. Every watch shares the Store's one etcd watch stream
(watch_hub: what a watcher is promised); a watch of one key is served, when it can be, from one
watch of its directory (watch_fanout), with the same promise.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import grpc
from aetcd import rpc

from holdfast.common import keepalive, tls
from holdfast.coordinator.store_errors import AnswerTooLarge, StoreUnavailable
from holdfast.coordinator.store_errors import Compacted as Compacted
from holdfast.coordinator.store_errors import TooLarge as TooLarge
from holdfast.coordinator.watch_fanout import Fanout
from holdfast.coordinator.watch_hub import UNREAD_BUDGET_BYTES, Budget, WatchHub

UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
DEFAULT_PREFIX = "/holdfast/v1/"
CALL_TIMEOUT_S = 5.0
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
RECEIVE_LIMIT_BYTES = 16 << 20  # the largest answer this client's channel takes from etcd
# Keys per Range of a listing: a page of the largest records (a chain at its 64 KiB cap, twice in a
# record with its replay copy, plus bounded fields: ~70 KB with room) stays within half the receive
# limit, so no number of sessions makes a listing fail. One Range of a whole prefix failed every
# listing of every tenant once the records together passed the limit (~267 at the cap). Records
# written before the cap (up to etcd's ~1.5 MiB request limit) are bounded by halving: a page whose
# answer is still too large is read again at half as many keys, down to one.
PAGE = RECEIVE_LIMIT_BYTES // (70 * 1024) // 2
# A streamed listing's page (snapshot_pages) by bytes too: a reader that stops between pages (a
# stalled WatchSessions) keeps one page, counted by no call limit and no watch budget, and a page of
# PAGE records at the cap was ~7.5 MiB (30 stalled calls: +14 MB each). Its first page is of
# FIRST_PAGE keys, each next one as many keys as the last one's records would fit in PAGE_BYTES
# (at least one, at most twice the last, at most PAGE): ~3 at the cap, PAGE of small records.
PAGE_BYTES = 256 << 10
FIRST_PAGE = 3  # records at the cap (~70 KB): within PAGE_BYTES from the first page


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True)
class Seen:
    """A key as a decision read it: its entry, or None when it was absent. A decision's transaction
    compares every Seen it depended on, so a change of any of them makes the transaction lose.
    `remembered`: the entry is the one this replica's own transaction wrote, not read back."""

    key: str
    entry: Entry | None
    remembered: bool = False

    def unchanged(self) -> list[rpc.Compare]:
        # A key read with a value is compared on its mod revision (a rewrite of the same bytes is a
        # change too); a key read absent must still be absent, not merely "re-created meanwhile".
        if self.entry is None:
            return [absent(self.key)]
        compares = [mod_equals(self.key, self.entry.mod_revision)]
        if self.remembered:
            # And on its bytes: an etcd restored from a backup may give this mod revision to another
            # value, which a decision made on the remembered bytes must not overwrite.
            compares.append(value_equals(self.key, self.entry.value))
        return compares


def unchanged(seen: Iterable[Seen]) -> list[rpc.Compare]:
    """The compares that every key is still as each of its readings found it. A key read twice
    alike is compared once. A key that changed between two readings is compared against both, so
    the transaction cannot apply: whichever reading the decision rested on, the other contradicts
    it. Why both: keeping one reading per key kept whichever came first in the list, not in time,
    and let a grant rest on a gate's read of its host's registration while comparing only the
    probe's later read of it (the owner's host being the taker's)."""
    readings: dict[tuple[str, int | None], Seen] = {}
    for s in seen:
        reading = (s.key, s.entry.mod_revision if s.entry is not None else None)
        if reading not in readings or s.remembered:  # a remembered one is compared on its bytes too
            readings[reading] = s
    return [compare for s in readings.values() for compare in s.unchanged()]


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


def endpoint_hosts(endpoints: str) -> list[str]:
    """`http://127.0.0.1:P1,https://h2:P2` → `["127.0.0.1:P1", "h2:P2"]`."""
    hosts = []
    for url in filter(None, (part.strip() for part in endpoints.split(","))):
        parsed = urlparse(url if "://" in url else f"http://{url}")
        if not parsed.hostname or not parsed.port:
            raise ValueError(f"etcd endpoint {url!r} needs host and port")
        hosts.append(f"{parsed.hostname}:{parsed.port}")
    if not hosts:
        raise ValueError("no etcd endpoints given")
    return hosts


def etcd_credentials(endpoints: str, etcd_tls_dir: Path | None) -> grpc.ChannelCredentials | None:
    """The coordinator's certificate for etcd's own CA, or None for plaintext; a mix is refused,
    so TLS configured never quietly falls back to plaintext (nor the other way round)."""
    schemes = {urlparse(u.strip()).scheme or "http" for u in endpoints.split(",") if u.strip()}
    wanted = "https" if etcd_tls_dir is not None else "http"
    if schemes != {wanted}:
        raise ValueError(f"etcd endpoints {endpoints!r} must all be {wanted}:// "
                         f"({'with' if etcd_tls_dir else 'without'} TLS configured)")
    return None if etcd_tls_dir is None else tls.channel_credentials(etcd_tls_dir, tls.Role("coordinator"))


def channel_target(endpoints: str) -> str:
    """`http://127.0.0.1:P1,http://127.0.0.1:P2` → `ipv4:127.0.0.1:P1,127.0.0.1:P2`."""
    return "ipv4:" + ",".join(endpoint_hosts(endpoints))


def open_channel(endpoints: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    options: list[tuple[str, object]] = [("grpc.lb_policy_name", "round_robin"),
                                         ("grpc.max_receive_message_length", RECEIVE_LIMIT_BYTES),
                                         *keepalive.channel_options(keepalive.ETCD_LOWEST_SECONDS)]
    target = channel_target(endpoints)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    # An `ipv4:` target list has no single host name to verify: every member's certificate must
    # name the first endpoint's host (one loopback address here; a shared service name elsewhere).
    options.append(("grpc.ssl_target_name_override", endpoint_hosts(endpoints)[0].rsplit(":", 1)[0]))
    return grpc.aio.secure_channel(target, credentials, options=options)


def mod_equals(key: str, revision: int) -> rpc.Compare:
    """revision 0 means the key must not exist (etcd reports mod_revision 0 for a missing key)."""
    return rpc.Compare(key=key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                       mod_revision=revision)


def value_equals(key: str, value: str | bytes) -> rpc.Compare:
    return rpc.Compare(key=key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE,
                       value=value.encode() if isinstance(value, str) else value)


def absent(key: str) -> rpc.Compare:
    return rpc.Compare(key=key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE,
                       create_revision=0)


def _too_large(exc: grpc.aio.AioRpcError) -> bool:
    """etcd's refusals of OUR request by its size: over --max-request-bytes ("request is too large"),
    or over its gRPC message limit above that (RESOURCE_EXHAUSTED "grpc: received message larger than
    max", the server's words; its other RESOURCE_EXHAUSTED, a full database or too many requests, are
    not refusals of this request's size). An answer too large for this client to receive ("CLIENT:
    Received message larger than max") is not the request's fault: `_answer_too_large`."""
    details = exc.details() or ""
    return ((exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "request is too large" in details)
            or (exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                and "received message larger than max" in details.lower() and not _answer_too_large(exc)))


def _answer_too_large(exc: grpc.aio.AioRpcError) -> bool:
    """etcd's answer exceeded this channel's receive limit (RECEIVE_LIMIT_BYTES)."""
    return (exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "CLIENT: Received message larger than max" in (exc.details() or ""))


def _range_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _entry(kv: rpc.KeyValue) -> Entry:
    return Entry(kv.key.decode(), kv.value, kv.mod_revision, kv.create_revision, kv.lease)


class Store:
    def __init__(self, channel: grpc.aio.Channel, prefix: str = DEFAULT_PREFIX,
                 unread_budget: int = UNREAD_BUDGET_BYTES) -> None:
        self.channel = channel
        self.prefix = prefix
        self._kv = rpc.KVStub(channel)
        self._lease = rpc.LeaseStub(channel)
        self._watches = WatchHub(rpc.WatchStub(channel), Budget(unread_budget))
        self._fanouts: dict[bytes, Fanout] = {}  # by directory: each one's shared watch
        self.newest = 0  # the highest revision an answer of etcd's named (how old a revision is)

    @classmethod
    def connect(cls, endpoints: str, credentials: grpc.ChannelCredentials | None = None,
                prefix: str = DEFAULT_PREFIX, unread_budget: int = UNREAD_BUDGET_BYTES) -> Store:
        """`unread_budget`: the bytes its watchers may hold unread together (watch_hub.Budget)."""
        return cls(open_channel(endpoints, credentials), prefix, unread_budget)

    async def close(self) -> None:
        await self.channel.close()

    @property
    def watch_budget(self) -> Budget:
        """Its watchers' unread bytes together, and their bound (watch_hub.Budget)."""
        return self._watches.budget

    @property
    def watch_creates(self) -> int:
        """WatchCreateRequests this Store has sent to etcd: a watch served by a shared one sends none."""
        return self._watches.creates

    @property
    def watch_handed(self) -> int:
        """Events the shared watches handed to the watches they serve: a change costs each it reaches."""
        return sum(fanout.handed for fanout in self._fanouts.values())

    def key(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    async def _call(self, method, request):  # type: ignore[no-untyped-def]
        try:
            resp = await method(request, timeout=CALL_TIMEOUT_S, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in UNAVAILABLE_CODES:
                raise StoreUnavailable(f"etcd: {exc.details()}") from exc
            if _too_large(exc):
                raise TooLarge(f"etcd: {exc.details()}") from exc
            if _answer_too_large(exc):
                raise AnswerTooLarge(f"etcd's answer is over the {RECEIVE_LIMIT_BYTES}-byte receive limit: "
                                     f"{exc.details()}") from exc
            raise
        self.newest = max(self.newest, resp.header.revision)
        return resp

    async def get(self, key: str, revision: int = 0) -> Entry | None:
        """The key now, or as it was at `revision` (`Compacted` once that is compacted away)."""
        try:
            resp = await self._call(self._kv.Range, rpc.RangeRequest(key=key.encode(), revision=revision))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                raise Compacted(f"etcd: {exc.details()}") from exc
            raise
        return _entry(resp.kvs[0]) if resp.kvs else None

    async def read(self, key: str) -> Seen:
        """A read a decision depends on: compare it with `unchanged` in the decision's transaction."""
        return Seen(key, await self.get(key))

    async def read_all(self, keys: Sequence[str]) -> list[Seen]:
        """Several reads a decision depends on, in one round trip and at one revision: a transaction
        of ranges only, which etcd serves as a linearizable read without a write through raft. Each
        is still compared on its own in the decision's transaction."""
        if len(keys) > MAX_TXN_OPS:
            raise ValueError(f"{len(keys)} reads in one transaction; etcd takes at most {MAX_TXN_OPS}")
        ops = [rpc.RequestOp(request_range=rpc.RangeRequest(key=k.encode())) for k in keys]
        resp = await self._call(self._kv.Txn, rpc.TxnRequest(success=ops))
        return [Seen(k, _entry(r.response_range.kvs[0]) if r.response_range.kvs else None)
                for k, r in zip(keys, resp.responses, strict=True)]

    async def list_prefix(
        self, prefix: str, start_after: str = "", limit: int = 0
    ) -> tuple[list[Entry], bool]:
        """Keys under prefix in key order after `start_after`, at most `limit` (0: all), read in pages
        of at most PAGE keys, all at one revision; returns (entries, more)."""
        entries, more, _ = await self._scan(prefix, start_after, limit)
        return entries, more

    async def snapshot_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        """Every key under prefix (paged as list_prefix), and the one revision they were read at (a
        watch from revision + 1 then misses no change)."""
        entries, _, revision = await self._scan(prefix)
        return entries, revision

    async def snapshot_pages(self, prefix: str) -> AsyncIterator[tuple[list[Entry], int]]:
        """`snapshot_prefix` a page at a time, each with the one revision of them all, so a reader
        that stops between pages (a stalled WatchSessions caller) keeps one page, not every key:
        of about PAGE_BYTES (one record when a record alone is more); the revision compacted before
        the last page is `Compacted` (list again)."""
        async for entries, _, revision in self._pages(prefix.encode(), "", 0, PAGE_BYTES):
            yield entries, revision

    async def _scan(self, prefix: str, start_after: str = "",
                    limit: int = 0) -> tuple[list[Entry], bool, int]:
        """Pages of Ranges: the first at the newest revision, the rest at the first's, so the whole
        listing is one snapshot (a compaction of that revision meanwhile lists again from the start)."""
        while True:
            entries: list[Entry] = []
            last = (False, 0)
            try:
                async for page, more, revision in self._pages(prefix.encode(), start_after, limit):
                    entries += page
                    last = (more, revision)
            except Compacted:
                continue
            return entries, *last

    async def _pages(self, raw: bytes, start_after: str, limit: int,
                     page_bytes: int = 0) -> AsyncIterator[tuple[list[Entry], bool, int]]:
        """(entries, more, revision) per Range: the first at the newest revision, the rest at the
        first's; its compaction meanwhile is `Compacted`. At least one page, maybe empty. With
        `page_bytes`, pages of about that many bytes (see PAGE_BYTES), else of PAGE keys."""
        page, revision, after, taken = FIRST_PAGE if page_bytes else PAGE, 0, start_after, 0
        while True:
            start = (after.encode() + b"\x00") if after else raw
            want = min(page, limit - taken) if limit else page
            try:
                resp = await self._call(self._kv.Range, rpc.RangeRequest(
                    key=start, range_end=_range_end(raw), limit=want, revision=revision,
                    sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY))
            except AnswerTooLarge:
                if want == 1:
                    raise
                page = max(1, want // 2)
                continue
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                raise Compacted(f"revision {revision} compacted while listing") from exc
            revision = revision or int(resp.header.revision)
            entries = [_entry(kv) for kv in resp.kvs]
            more = bool(resp.more) and bool(entries)
            taken += len(entries)
            # Read before it is handed on: a reader may let the page go (clear it), and the answer
            # is let go before (else a stalled reader kept the page twice: as read, and as entries).
            after = entries[-1].key if entries else after
            del resp
            if page_bytes and entries:
                size = sum(len(e.key) + len(e.value) for e in entries)
                page = max(1, min(PAGE, 2 * len(entries), len(entries) * page_bytes // size))
            yield entries, more, revision
            if not more or (limit and taken >= limit):
                return

    async def txn(self, compares: Sequence[rpc.Compare], puts: Sequence[Put],
                  deletes: Sequence[str] = (), delete_prefixes: Sequence[str] = ()) -> tuple[bool, int]:
        """All puts and deletes (keys, and whole prefixes) in one transaction, applied only if every
        compare holds."""
        ops = [rpc.RequestOp(request_put=rpc.PutRequest(key=p.key.encode(), value=p.value, lease=p.lease))
               for p in puts]
        ops += [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k.encode())) for k in deletes]
        ops += [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
            key=k.encode(), range_end=_range_end(k.encode()))) for k in delete_prefixes]
        try:
            resp = await self._call(self._kv.Txn, rpc.TxnRequest(compare=list(compares), success=ops))
        except StoreUnavailable as exc:
            raise StoreUnavailable(str(exc), outcome_unknown=True) from exc
        return bool(resp.succeeded), int(resp.header.revision)

    async def grant_lease(self, ttl_seconds: int) -> int:
        resp = await self._call(self._lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl_seconds))
        return int(resp.ID)

    async def refresh_lease(self, lease_id: int) -> int:
        """Renews once; returns the remaining TTL, 0 when the lease no longer exists."""
        try:
            stream = self._lease.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                                                timeout=CALL_TIMEOUT_S)
            async for reply in stream:
                return int(reply.TTL)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in UNAVAILABLE_CODES:
                raise StoreUnavailable(f"etcd: {exc.details()}") from exc
            raise
        return 0

    async def revoke_lease(self, lease_id: int) -> None:
        await self._call(self._lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id))

    async def watch_prefix(self, prefix: str, start_revision: int,
                           reached: int = 0) -> AsyncIterator[Entry | str]:
        """Yields changed entries (or the key of a deleted one) from `start_revision` on; ends in
        `Compacted` (re-list: also when etcd has not reached revision `reached`) or
        `StoreUnavailable`, never in silence (watch_hub)."""
        raw = prefix.encode()
        async with contextlib.aclosing(self._watches.watch(raw, _range_end(raw), start_revision,
                                                           reached)) as events:
            async for event in events:
                yield _change(event)

    async def watch_key(self, key: str, start_revision: int, reached: int = 0) -> AsyncIterator[Entry | str]:
        """The changes of exactly `key`, as `watch_prefix` yields them and with its errors. Served
        from one shared watch of the key's directory (its prefix up to its last "/": every
        session's record for one session's) whenever that holds every change from
        `start_revision` on, so the watch sends etcd nothing (watch_fanout); else a watch of its
        own, as `watch_prefix(key)` with only the key's own changes."""
        raw = key.encode()
        served = self._fanout(raw[:raw.rindex(b"/") + 1]).serve(raw, start_revision, reached, self.newest)
        if served is None:
            async with contextlib.aclosing(self.watch_prefix(key, start_revision, reached)) as changes:
                async for change in changes:
                    if (change if isinstance(change, str) else change.key) == key:
                        yield change
            return
        async with contextlib.aclosing(served) as events:
            async for event in events:
                yield _change(event)


    async def watch_tagged(self, directory: str, start_revision: int, tag: Callable[[Entry], str | None],
                           wanted: str | None) -> AsyncIterator[Entry | str]:
        """The changes under `directory` (ending in "/"), as `watch_prefix` yields them and with its
        errors, of which at least every put `tag` tags `wanted` or None (`wanted` None: every put)
        and the deletion of every key whose last put was (watch_fanout). Served, when it can be,
        from the directory's shared watch: no watch at etcd, each put tagged once for every such
        caller of the replica (`tag` is the directory's: every caller of it passes the same) and
        handed only to those that want it; else a watch of its own, with every change."""
        raw = directory.encode()
        served = self._fanout(raw).serve_tagged(lambda event: tag(_entry(event.kv)), wanted,
                                                start_revision, self.newest)
        if served is None:
            async with contextlib.aclosing(self.watch_prefix(directory, start_revision)) as changes:
                async for change in changes:
                    yield change
            return
        async with contextlib.aclosing(served) as events:
            async for event in events:
                yield _change(event)

    def _fanout(self, directory: bytes) -> Fanout:
        fanout = self._fanouts.get(directory)
        if fanout is None:
            fanout = self._fanouts[directory] = Fanout(self._watches, directory, _range_end(directory))
        return fanout


def _change(event: rpc.Event) -> Entry | str:
    return event.kv.key.decode() if event.type == rpc.Event.DELETE else _entry(event.kv)
