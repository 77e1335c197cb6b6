"""The public library, async form: a session's CMD run as an async context manager, fenced reads and
writes, the provider handle and the record's changes. holdfast.client.sync runs exactly this on a
private event loop; neither decides anything itself (holdfast.client.owner and connection do).

A session's writer is CMD, a child this process spawns — never the calling process: the child is
spawned behind a gate with a spawn token only this process knows, so the host's agent can attest it
(and hold its whole tree in a session cgroup) before the grant is committed, and CMD runs only once
it is. Leaving the block, a takeover or a lost fence ends that tree, proven gone, before the grant is
released; a caller's own process could be neither attested by a token it did not inherit nor proven
ended while it still runs, so committing it is refused (INVALID_ARGUMENT, naming the pid).

Guarantee: leaving `async with` a run — normally, by an exception or by a cancel — ends CMD's tree
(SIGTERM, `grace`, SIGKILL) unless it has ended, and releases the grant before the exit returns; an
exception raised in the block is re-raised as it was (a release that then fails is logged, not
raised over it). Signal handlers are installed only with `forward_signals=True`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import fields
from types import TracebackType
from typing import TypedDict, Unpack

from holdfast.client.acquire import RunSpec
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.client.owner import Owner
from holdfast.client.results import FencedValue, Record, record_of, value_of
from holdfast.client.tree import end_tree
from holdfast.common.reasons import Reason

log = logging.getLogger("holdfast")
PathLike = str | os.PathLike[str]


class RunOptions(TypedDict, total=False):
    """The options of `holdfast run`, by the names of RunSpec: `takeover`, `force`, `wait`,
    `handoff_timeout`, `grace` in seconds; `cwd`, `provider`, `location`, `guards`, `carry`,
    `carry_every`; and `forward_signals` (default False: the library leaves signals alone)."""

    takeover: bool
    force: bool
    wait: float
    handoff_timeout: float
    grace: float
    cwd: str | None
    provider: str
    location: str
    guards: Sequence[str]
    carry: Sequence[str]
    carry_every: float
    forward_signals: bool


SPEC_OPTIONS = frozenset(f.name for f in fields(RunSpec)) - {"session_id", "argv"}


def spec_of(session_id: str, argv: Sequence[str], options: RunOptions) -> tuple[RunSpec, bool]:
    """The RunSpec and whether to forward signals; INVALID_ARGUMENT for a CMD given as one string
    (it would be looked up as one program name) or an option `run` does not have."""
    if isinstance(argv, str | bytes):
        raise ClientError(Reason.INVALID_ARGUMENT, "CMD is a list of words, e.g. ['codex', 'exec', PROMPT], "
                          f"not the string {argv!r}", session_id)
    given: dict[str, object] = dict(options)
    forward = bool(given.pop("forward_signals", False))
    unknown = sorted(set(given) - SPEC_OPTIONS)
    if unknown:
        raise ClientError(Reason.INVALID_ARGUMENT, f"no such option: {', '.join(unknown)}", session_id)
    for name in ("guards", "carry"):
        if name in given:
            given[name] = list(given[name])  # type: ignore[call-overload]
    return RunSpec(session_id, list(argv), **given), forward  # type: ignore[arg-type]


class AsyncConnection:
    """One channel to a coordinator (`address`, else $HOLDFAST_COORDINATOR, else `holdfast up`'s),
    as this host (`host_id`, else $HOLDFAST_HOST_ID, else the node name), with TLS from `tls_dir`
    (else $HOLDFAST_TLS_DIR or `holdfast up --tls`'s). Made inside a running event loop."""

    def __init__(self, address: str | None = None, *, host_id: str | None = None,
                 tls_dir: PathLike | None = None) -> None:
        self.client = Client(address, host_id, tls_dir)

    @property
    def address(self) -> str:
        """The coordinator's address this connection calls."""
        return self.client.address

    @property
    def host_id(self) -> str:
        """The host id this connection acquires as (the one its agent registered)."""
        return self.client.host_id

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel; a run still in its block keeps nothing working through it."""
        await self.client.close()

    def session(self, session_id: str, argv: Sequence[str], **options: Unpack[RunOptions]) -> AsyncRun:
        """A run of CMD (`argv`) as the session's writer, on this connection: `async with` it."""
        return AsyncRun(self, session_id, argv, options)

    async def record(self, session_id: str) -> Record | None:
        """The session's record, None when it has none."""
        try:
            return record_of((await self.client.get_session(session_id)).record)
        except ClientError as err:
            if err.reason == Reason.NOT_FOUND:
                return None
            raise

    async def get(self, session_id: str, key: str) -> FencedValue:
        """A fenced key of the session, as last written by any of its owners."""
        return value_of(session_id, key, await self.client.fenced_get(session_id, key))

    async def put(self, grant: Grant, key: str, value: bytes) -> int:
        """Writes `key` under `grant` (its fence and secret in the write's own transaction); the etcd
        revision written. StaleFence once the session has moved past the grant."""
        return await self.client.fenced_put(grant, key, value)

    async def record_handle(self, grant: Grant, handle: str) -> Record:
        """Appends the provider's handle (what the next owner resumes) under `grant`; the record."""
        return record_of(await self.client.record_provider_handle(grant, handle))

    async def watch(self, session_id: str, grant: Grant | None = None) -> AsyncIterator[Record]:
        """The session's record now, then at every change (reconnecting while the coordinator is
        away); with `grant`, a record from another cluster than the grant's raises Unavailable."""
        async for record in self.client.watch(session_id, grant):
            yield record_of(record)


class AsyncRun:
    """CMD run as a session's single writer. `async with` starts it — CMD runs once its commit
    succeeded — and, leaving, ends CMD's tree if it still runs and releases the grant."""

    def __init__(self, connection: AsyncConnection, session_id: str, argv: Sequence[str],
                 options: RunOptions, owns_connection: bool = False) -> None:
        self.spec, self.forward_signals = spec_of(session_id, argv, options)
        self.connection = connection
        self.owns_connection = owns_connection  # closed with the run (`asession`)
        self.owner: Owner | None = None
        self.supervisor: asyncio.Task[int] | None = None

    async def __aenter__(self) -> AsyncRun:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        try:
            if error is None:
                await self.stop()
                return
            try:
                await self.stop()
            except ClientError as failed:  # the block's own exception is the one that goes on
                log.warning("session %s: leaving after %r, the release failed: %s", self.session_id, error,
                            failed)
        finally:
            if self.owns_connection:
                await self.connection.close()

    async def start(self) -> None:
        """Acquires (as the options say: once, waiting, or as a takeover) and starts CMD; raises the
        refusal's typed ClientError with nothing run."""
        if self.owner is not None:
            raise ClientError(Reason.INVALID_ARGUMENT, "this run has started already", self.spec.session_id)
        try:
            self.owner = await Owner.start(self.connection.client, self.spec, log.info)
            self.supervisor = asyncio.create_task(self.owner.supervise(self.forward_signals))
            # One turn of the loop: the supervisor runs up to its first wait, its signal handlers (with
            # forward_signals) installed, before the block begins — a signal there would otherwise find
            # the default action and end this process with CMD left running.
            await asyncio.sleep(0)
        except BaseException as error:
            # Cancelled in that turn, CMD running: `async with` calls no __aexit__ for an __aenter__
            # that raised, so CMD is ended and the grant released here, as leaving the block does.
            if self.supervisor is not None:
                await self.__aexit__(type(error), error, error.__traceback__)
            elif self.owns_connection:
                await self.connection.close()
            raise

    def _started(self) -> tuple[Owner, asyncio.Task[int]]:
        if self.owner is None or self.supervisor is None:
            raise ClientError(Reason.INVALID_ARGUMENT, "this run has not started: `async with` it",
                              self.spec.session_id)
        return self.owner, self.supervisor

    async def wait(self) -> int:
        """Until CMD has ended (by itself, or asked to let go) and the grant is released: CMD's status
        as a shell reports it (128 + N when signal N ended it)."""
        return await asyncio.shield(self._started()[1])

    async def stop(self) -> int:
        """Ends CMD's tree if it still runs (SIGTERM, `grace`, SIGKILL), then as `wait`."""
        owner, supervisor = self._started()
        if not supervisor.done():
            await asyncio.to_thread(end_tree, owner.tree, self.spec.grace)
        return await asyncio.shield(supervisor)

    @property
    def session_id(self) -> str:
        """The session this run is the writer of."""
        return self.spec.session_id

    @property
    def grant(self) -> Grant:
        """The grant every fenced write of this run carries (its secret is never printed)."""
        return self._started()[0].grant

    @property
    def fence(self) -> int:
        """The grant's fence: every write under it is refused once the session has moved past it."""
        return self.grant.fence

    @property
    def pid(self) -> int:
        """CMD's pid (its gate's, exec'd into CMD): the leader of CMD's process group."""
        return self._started()[0].gate.pid

    @property
    def record(self) -> Record:
        """The session's record as committed to CMD: `record.resume_handle` is what CMD resumes."""
        return record_of(self._started()[0].record)

    @property
    def running(self) -> bool:
        """Whether CMD's tree has yet to end and the grant to be released."""
        return not self._started()[1].done()

    @property
    def status(self) -> int | None:
        """CMD's status as `wait` returns it, once CMD has ended and the grant was released; None
        before (or the error that ended the supervision, raised)."""
        supervisor = self._started()[1]
        return supervisor.result() if supervisor.done() else None

    @property
    def ended_by(self) -> str:
        """"handoff" once a takeover or a drain asked this owner to let go, "lost" once its fence
        moved on without asking, "" otherwise."""
        return self._started()[0].ended_by

    async def put(self, key: str, value: bytes) -> int:
        """A fenced write under this run's grant: StaleFence once the session has moved on."""
        return await self.connection.put(self.grant, key, value)

    async def get(self, key: str) -> FencedValue:
        """The session's fenced `key`, as last written by any of its owners."""
        return await self.connection.get(self.session_id, key)

    async def record_handle(self, handle: str) -> Record:
        """Records the provider's handle under this run's grant (what the next owner resumes)."""
        return await self.connection.record_handle(self.grant, handle)

    def watch(self) -> AsyncIterator[Record]:
        """The session's record now and at every change, checked to come from the grant's cluster."""
        return self.connection.watch(self.session_id, self.grant)


def asession(session_id: str, argv: Sequence[str], *, address: str | None = None, host_id: str | None = None,
             tls_dir: PathLike | None = None, **options: Unpack[RunOptions]) -> AsyncRun:
    """A run of CMD as the session's writer on a connection of its own, closed with it:
    `async with asession("S", ["codex", "exec", PROMPT], takeover=True) as run: ...`. Called inside a
    running event loop."""
    spec_of(session_id, argv, options)  # a bad argument opens no channel
    return AsyncRun(AsyncConnection(address, host_id=host_id, tls_dir=tls_dir), session_id, argv, options,
                    owns_connection=True)
