"""The HostAgent gRPC servicer: validates every request whole (agent/requests.py: INVALID_ARGUMENT with
what was wrong, nothing changed), then answers only for this host from its own process table.

Guarantee: no call reads another process's memory on the event loop. Whatever reads an environ (an
attestation, a scan, a kill, a probe or exit watch whose token decides) runs as one job per call on
a reader thread (agent/reads.py), its reads guarded: a process whose read is stuck is unreadable,
never dead, and heartbeats and every other call go on meanwhile. A probe, an exit watch's arming
and a tree proof are first tried on the loop with a reader that reads nothing (`reads.on_loop`):
at its first environ they start over as a job. What a call answers does not depend on where it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import grpc

from holdfast.agent import metrics, probe_rules, requests
from holdfast.agent.exit_watch import Armed, ExitWatcher
from holdfast.agent.hostinfo import HostFacts
from holdfast.agent.kill import Stopped, kill_tree
from holdfast.agent.observe import observe, observe_tree, pidfd_exited
from holdfast.agent.reads import OnLoop, Readers, on_loop
from holdfast.common import identifiers, reasons
from holdfast.common.identifiers import InvalidInput
from holdfast.common.reasons import Reason
from holdfast.common.version import VERSION
from holdfast.proc import cgroups
from holdfast.proc import scan as scan_
from holdfast.proc.ages import ProcessAges
from holdfast.proc.ending import KILL_WAIT_S
from holdfast.proc.environ import EnvironReader, read_proc_file, value_in_block
from holdfast.proc.procstat import ProcStat, StatParseError, parse_stat
from holdfast.proc.scan import Scan
from holdfast.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger("holdfast.agent")
P = agent_pb2.ProbeOutcome
SWEEP_EVERY_S = 30.0
T = TypeVar("T")
# A tree scan's first pass is tried on the event loop while the last scan listed at most this many
# /proc entries: a quiet host's whole tree proof (it reads no environ of a process older than its
# roots) costs less there than the hand-off to a thread and back (~0.2 ms of agent CPU).
INLINE_LISTING = 512


def trees_wanted(judged: Sequence[tuple[agent_pb2.ProcessIdentity, agent_pb2.ProbeResult]],
                 ) -> tuple[frozenset[bytes], int, scan_.Dead]:
    """What a tree check of these owners (each with its root's verdict) scans for: their tokens
    only (others' churn then settles a pass), no environ of a process older than every one of
    their roots, nor the stat of one whose age the agent holds, and a root whose exit was observed
    (its pidfd, before this scan) settling as a zombie at once (proc/scan.py, proc/ages.py)."""
    owners = [owner for owner, _ in judged]
    tokens = frozenset(o.spawn_token.encode() for o in owners if o.spawn_token)
    born_since = min((o.start_ticks for o in owners), default=0)  # 0, an unknown start: read all
    dead = {o.pid: (o.start_ticks, o.pidfd_ino) for o, r in judged if r.outcome == P.EXIT_OBSERVED}
    return tokens, born_since, dead


def pidfd_budget() -> int:
    """How many pidfds the process ages may hold: half the open-file limit, the rest left to
    sockets and the exit watches (the agent's start raises the limit to its hard maximum)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2


async def abort(context: grpc.aio.ServicerContext, reason: Reason, message: str) -> None:
    """A refusal with its reason's status code (common/reasons.py): nothing was done."""
    await context.abort_with_status(reasons.status(reasons.wire_code(reason), reason, message))


def _refused(made: agent_pb2.CgroupRef | None, why: str) -> tuple[None, str]:
    """An attestation refused after its move: what was moved may be a process that took the gate's
    pid (the gate exited between its check and the move), so it goes back where it was."""
    if made is not None:
        cgroups.undo(made)
    return None, why


class HostAgentService(agent_pb2_grpc.HostAgentServicer):
    def __init__(self, host_id: str, facts: HostFacts, spawn_token_env: str) -> None:
        self.host_id = host_id
        self.facts = facts
        self.spawn_token_env = spawn_token_env
        self.variable = spawn_token_env.encode()
        self.cgroups = facts.cgroups
        self.watcher = ExitWatcher(self.probe_proc)
        self.ages = ProcessAges(pidfd_budget())
        # Every read of another process's environ: on a reader thread, through this guard.
        self.readers = Readers()
        self.environ = self.readers.environ
        self.listed = INLINE_LISTING + 1  # /proc entries the last scan listed; none yet: a thread

    async def reading(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args, environ)` on the loop with `on_loop` as its reader, or, at its first environ
        read, started over as a job on a reader thread with the guarded one. `fn` does nothing before
        a read that it could not do twice."""
        try:
            return fn(*args, on_loop)
        except OnLoop:
            return await self.readers.run(fn, *args, self.environ)

    # -- scanning ----------------------------------------------------------------------------------
    def scan(self, token: bytes | frozenset[bytes] | None, born_since: int, dead: scan_.Dead | None,
             environ: EnvironReader) -> Scan:
        """One stable scan (with the process ages when it looks for trees), timed and counted. On the
        loop (`on_loop`) only a tree scan's first pass runs, over a small listing, reading no environ
        and settled: anything more raises OnLoop, and the scan runs whole on a reader thread."""
        inline = environ is on_loop
        if inline and (not born_since or self.listed > INLINE_LISTING):
            raise OnLoop
        started = time.monotonic()
        result = scan_.scan(self.variable, token, born_since=born_since,
                            ages=self.ages if born_since else None, dead=dead, environ=environ,
                            max_passes=1 if inline else scan_.MAX_PASSES)
        self.listed = result.listed
        if inline and not result.stable:
            raise OnLoop
        metrics.observe_scan(result, time.monotonic() - started)
        return result

    def scan_trees(self, judged: Sequence[tuple[agent_pb2.ProcessIdentity, agent_pb2.ProbeResult]],
                   environ: EnvironReader) -> Scan:
        """The scan a tree check of these owners needs (`trees_wanted`)."""
        tokens, born_since, dead = trees_wanted(judged)
        return self.scan(tokens, born_since, dead, environ)

    # -- judging (every environ read through the reader given: `on_loop` or the guarded one) ------
    def _stamp(self, result: agent_pb2.ProbeResult) -> agent_pb2.ProbeResult:
        result.answered_by_host_id = self.host_id
        result.answered_by_incarnation.CopyFrom(self.facts.incarnation)
        if not result.observed_at_unix_ms:
            result.observed_at_unix_ms = int(time.time() * 1000)
        return result

    def probe_proc(self, identity: agent_pb2.ProcessIdentity,
                   environ: EnvironReader) -> agent_pb2.ProbeResult:
        """/proc evidence only, without the exit memory (used by the watcher's re-check)."""
        seen = observe(identity, self.variable, False, environ)
        return probe_rules.judge(identity, self.host_id, self.facts.incarnation, seen, self.spawn_token_env)

    def probe(self, identity: agent_pb2.ProcessIdentity, tree: Scan | None,
              environ: EnvironReader) -> agent_pb2.ProbeResult:
        if identity.host_id == self.host_id and identity.incarnation == self.facts.incarnation:
            seen = observe(identity, self.variable, self.watcher.exited(identity), environ)
        else:
            seen = probe_rules.Observation()  # judged on host id / incarnation alone
        result = probe_rules.judge(identity, self.host_id, self.facts.incarnation, seen, self.spawn_token_env)
        if tree is not None:
            self.judge_tree(identity, tree, result)
        return self._stamp(result)

    def judge_tree(self, identity: agent_pb2.ProcessIdentity, tree: Scan,
                   result: agent_pb2.ProbeResult) -> None:
        observed = observe_tree(identity, tree, self.cgroups)
        state, why = probe_rules.tree_verdict(identity, observed, self.spawn_token_env)
        result.tree_state, result.tree_reason = state, why
        # For coordinators from before tree_state: its two booleans.
        result.tree_checked, result.tree_gone = True, state == agent_pb2.TREE_GONE

    def judge_own_tree(self, identity: agent_pb2.ProcessIdentity, result: agent_pb2.ProbeResult,
                       environ: EnvironReader) -> None:
        """`result`, the root's verdict, with the tree that verdict calls for judged."""
        self.judge_tree(identity, self.scan_trees([(identity, result)], environ), result)

    def probe_tree(self, identity: agent_pb2.ProcessIdentity, before: agent_pb2.ProbeResult,
                   environ: EnvironReader) -> agent_pb2.ProbeResult:
        """A probe with the tree judged that the root's verdict `before` calls for (read first)."""
        return self.probe(identity, self.scan_trees([(identity, before)], environ), environ)

    def probe_owners(self, owners: Sequence[agent_pb2.ProcessIdentity], check_tree: bool,
                     environ: EnvironReader) -> list[agent_pb2.ProbeResult]:
        """ProbeOwners' answer. The tree is read only for roots not proven alive. A live root is its
        session held whatever its tree does, and no rule reads a tree then (a dead root's and an
        unused reservation's are read): so a probe of a held session — `holdfast probe`, a waiting
        Acquire, a handoff request — reads no process list. Reading the tree after its root was
        judged (it was read before) changes nothing: a root proven dead stays dead, and the scan is
        the tree's own proof."""
        results = [self.probe(o, None, environ) for o in owners]
        unproven = [(o, r) for o, r in zip(owners, results, strict=True) if r.outcome != P.IDENTITY_MATCHED]
        if check_tree and unproven:
            tree = self.scan_trees(unproven, environ)
            for owner, result in unproven:
                self.judge_tree(owner, tree, result)
        return results

    def arm_all(self, owners: Sequence[agent_pb2.ProcessIdentity], environ: EnvironReader) -> list[Armed]:
        armed: list[Armed] = []
        try:
            for owner in owners:
                armed.append(self.watcher.arm(owner, environ))
        except BaseException:  # to start over as a job, or given up while stuck on a read
            for fd, _ in armed:
                if fd is not None:
                    os.close(fd)
            raise
        return armed

    def token_roots(self) -> agent_pb2.ListTokenRootsResponse:
        found = self.scan(None, 0, None, self.environ)
        roots = []
        complete = found.complete
        for carrier in found.carriers:
            token = carrier.token.decode(errors="replace")
            if carrier.root and identifiers.is_spawn_token(token):
                identity = self.identity_of(carrier.pid, token)
                if identity is None:
                    # A root whose identity could not be taken is a root not listed: its tree may
                    # live on under a new root, so the listing cannot claim to be whole.
                    complete = False
                else:
                    roots.append(agent_pb2.TokenRoot(identity=identity))
        return agent_pb2.ListTokenRootsResponse(complete=complete, unreadable=found.unreadable, roots=roots)

    def identity_of(self, pid: int, token: str) -> agent_pb2.ProcessIdentity | None:
        """The full identity of a live pid, taken through a pidfd so it cannot name a reused pid."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        try:
            return self._identity(fd, pid, parse_stat(read_proc_file(f"/proc/{pid}/stat")), token)
        except (OSError, StatParseError):
            return None
        finally:
            os.close(fd)

    def _identity(self, fd: int, pid: int, stat: ProcStat, token: str) -> agent_pb2.ProcessIdentity | None:
        """The identity of the process `fd` (a pidfd of `pid`) names, `stat` read after `fd` was
        opened; None when that process has exited by the end, so every read here was of it."""
        try:
            identity = agent_pb2.ProcessIdentity(
                host_id=self.host_id, incarnation=self.facts.incarnation, pid=pid,
                start_ticks=stat.start_ticks, pidfd_ino=os.fstat(fd).st_ino if self.facts.pidfs else 0,
                spawn_token=token, spawn_token_env=self.spawn_token_env,
            )
            cgroup = cgroups.session_cgroup_of(pid, self.cgroups.root, self.cgroups.namespace)
            if cgroup is not None:
                identity.cgroup.CopyFrom(cgroup)
            proof, why = cgroups.tree_proof(pid, cgroup, self.cgroups)
            identity.tree_proof, identity.tree_proof_reason = proof, why
            return None if pidfd_exited(fd) else identity
        except OSError:
            return None

    def _carries(self, pid: int, start_ticks: int | None, token: bytes) -> bool:
        try:
            block = self.environ(pid, start_ticks, "/proc")
        except OSError:
            return False
        return block is not None and value_in_block(block, self.variable) == token

    def _open_root(self, pid: int, token: bytes) -> tuple[int, int, ProcStat] | None:
        """(pid, a pidfd of it, its stat), when it is a root of the token's tree: it carries the
        token and its parent does not. Both are read after the pidfd was opened, so a caller that
        finds the pidfd not exited afterwards knows they were that process's. The caller closes it."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        try:
            stat = parse_stat(read_proc_file(f"/proc/{pid}/stat"))
            if self._carries(pid, stat.start_ticks, token) and not self._carries(stat.ppid, None, token):
                return pid, fd, stat
        except (OSError, StatParseError):
            pass
        except BaseException:  # the job given up (agent/reads.py): it runs again elsewhere
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _root_of(self, token: bytes, pid_hint: int) -> tuple[int, int, ProcStat] | str:
        """The single tree root carrying the token, opened (see `_open_root`): the hint when it is
        one, else the one a full scan finds; or why there is none."""
        if pid_hint and (opened := self._open_root(pid_hint, token)) is not None:
            return opened
        roots = [c for c in self.scan(token, 0, None, self.environ).carriers if c.root]
        if len(roots) != 1:
            return f"{len(roots)} tree roots carry the token; attestation needs exactly one"
        return self._open_root(roots[0].pid, token) or "the token's root exited during attestation"

    def attest(self, token: str, pid_hint: int, session_id: str,
               fence: int) -> tuple[agent_pb2.ProcessIdentity | None, str]:
        """The root's identity, after the root (a gate still blocked on its pipe, so nothing of the
        tree has forked yet) was moved into a session cgroup made here for it. One pidfd, opened
        before anything of the root was read, is polled after its move and every read: not exited
        then, the pid named that one process throughout (a pid is free again only once its process
        is reaped), so the token and start ticks read are its own and the move moved it; exited, or
        its pid taken by another process before the move, the attestation is refused and undone."""
        opened = self._root_of(token.encode(), pid_hint)
        if isinstance(opened, str):
            return None, opened
        return self._attest_root(opened, token, session_id, fence)

    def _attest_root(self, opened: tuple[int, int, ProcStat], token: str, session_id: str,
                     fence: int) -> tuple[agent_pb2.ProcessIdentity | None, str]:
        """`_attest_opened` of a root `_open_root` opened; closes its pidfd."""
        pid, fd, stat = opened
        try:
            return self._attest_opened(pid, fd, stat, token, session_id, fence)
        finally:
            os.close(fd)

    def _attest_opened(self, pid: int, fd: int, stat: ProcStat, token: str, session_id: str,
                       fence: int) -> tuple[agent_pb2.ProcessIdentity | None, str]:
        made, why = cgroups.make_session_cgroup(pid, session_id, fence, self.cgroups) if session_id else (
            None, "the attestation request named no session")
        identity = self._identity(fd, pid, stat, token)
        if identity is None:
            return _refused(made, "the token's root exited during attestation")
        if made is None:
            log.warning("attested without a session cgroup: the tree's end rests on the scan",
                        extra={"fields": {"pid": pid, "reason": why}})
            identity.tree_proof_reason = why
        elif identity.cgroup != made:
            return _refused(made, f"pid {pid} left its session cgroup {made.path} during attestation")
        metrics.observe_attestation(identity)
        return identity, ""

    async def sweep_cgroups(self) -> None:
        """Removes empty session cgroups now and every SWEEP_EVERY_S (also those made before a
        restart); runs until cancelled."""
        while True:
            removed = await asyncio.to_thread(cgroups.sweep, self.cgroups)
            metrics.SESSION_CGROUPS_SWEPT.inc(removed)
            await asyncio.sleep(SWEEP_EVERY_S)

    # -- RPCs --------------------------------------------------------------------------------------
    async def GetHostInfo(self, request, context):
        f = self.facts
        return agent_pb2.HostInfo(
            host_id=self.host_id, incarnation=f.incarnation, clock_ticks_per_second=f.clock_ticks,
            can_enumerate=f.can_enumerate, pidfs=f.pidfs, cgroup_writable=self.cgroups.able,
            cgroup_root=f.cgroup_root, agent_version=VERSION, spawn_token_env=self.spawn_token_env,
            session_cgroups=self.cgroups.able, session_cgroups_reason=self.cgroups.reason,
        )

    async def ScanSpawnToken(self, request, context):
        try:
            requests.check_scan(request)
        except InvalidInput as exc:
            return await abort(context, Reason.INVALID_ARGUMENT, str(exc))
        found = await self.readers.run(self.scan, request.spawn_token.encode(), 0, None, self.environ)
        return agent_pb2.ScanResult(
            enumerable=found.enumerable, complete=found.complete, scanned=found.scanned,
            unreadable=found.unreadable, passes=found.passes, stable=found.stable,
            init_unreadable=found.init_unreadable,
            carriers=[agent_pb2.TokenCarrier(pid=c.pid, ppid=c.ppid, root=c.root) for c in found.carriers],
        )

    async def AttestSpawn(self, request, context):
        try:
            requests.check_attest(request)
        except InvalidInput as exc:
            return await abort(context, Reason.INVALID_ARGUMENT, str(exc))
        # One job, whether the root is at its hint (what `run` sends) or only a scan finds it: the
        # hint's and its parent's environs are another process's memory too.
        identity, why = await self.readers.run(self.attest, request.spawn_token, request.pid_hint,
                                               request.session_id, request.fence)
        if identity is None:
            log.info("attestation refused", extra={"fields": {"reason": why}})
            return await abort(context, Reason.ATTESTATION_FAILED, why)
        return agent_pb2.AttestSpawnResponse(identity=identity)

    async def ListTokenRoots(self, request, context):
        return await self.readers.run(self.token_roots)

    async def ProbeOwners(self, request, context):
        try:
            requests.check_batch(list(request.owners))
        except InvalidInput as exc:
            return await abort(context, Reason.INVALID_ARGUMENT, str(exc))
        started = time.monotonic()
        results = await self.reading(self.probe_owners, request.owners, request.check_tree)
        metrics.observe_probes(self.host_id, results, time.monotonic() - started)
        return agent_pb2.ProbeOwnersResponse(results=results)

    async def WatchExits(self, request, context) -> AsyncIterator[agent_pb2.ExitEvent]:
        try:
            requests.check_batch(list(request.owners))
        except InvalidInput as exc:
            await abort(context, Reason.INVALID_ARGUMENT, str(exc))
            return
        pending: dict[asyncio.Future[agent_pb2.ProbeResult], agent_pb2.ProcessIdentity] = {}
        answered = []
        local = []
        for owner in request.owners:
            if owner.host_id == self.host_id and owner.incarnation == self.facts.incarnation:
                local.append(owner)
            else:  # judged on host id / incarnation alone: nothing read
                answered.append(agent_pb2.ExitEvent(identity=owner, result=self.probe(owner, None, on_loop)))
        for owner, watch in zip(local, await self.watch(local), strict=True):
            pending[watch] = owner
        yield agent_pb2.ExitEvent(armed=True)
        for event in answered:
            yield await self._with_tree(event, request.check_tree)
        while pending:
            # shield: a watch is shared by every stream on the same identity; one cancel must not end it.
            await asyncio.wait([asyncio.shield(f) for f in pending], return_when=asyncio.FIRST_COMPLETED)
            for fut in [f for f in pending if f.done()]:
                owner = pending.pop(fut)
                result = fut.result() if not fut.cancelled() else agent_pb2.ProbeResult(
                    outcome=P.INDETERMINATE, reason="the agent stopped watching this owner")
                yield await self._with_tree(agent_pb2.ExitEvent(identity=owner, result=self._stamp(result)),
                                            request.check_tree)

    async def _with_tree(self, event: agent_pb2.ExitEvent, check_tree: bool) -> agent_pb2.ExitEvent:
        """With `check_tree`, a root not proven alive has its tree judged as ProbeOwners judges it
        (the tree read after the root was: a root proven dead stays dead)."""
        if check_tree and event.result.outcome != P.IDENTITY_MATCHED:
            await self.reading(self.judge_own_tree, event.identity, event.result)
        return event

    async def watch(self, owners: Sequence[agent_pb2.ProcessIdentity],
                    ) -> list[asyncio.Future[agent_pb2.ProbeResult]]:
        """An exit watch of each of this host's owners; those not watched yet armed in one job."""
        held = [self.watcher.known(o) for o in owners]
        fresh = [o for o, h in zip(owners, held, strict=True) if h is None]
        armed = iter(await self.reading(self.arm_all, fresh) if fresh else [])
        return [h if h is not None else self.watcher.watch(o, next(armed))
                for o, h in zip(owners, held, strict=True)]

    async def KillOwner(self, request, context):
        try:
            requests.check_kill(request, self.cgroups.root)
        except InvalidInput as exc:
            return await abort(context, Reason.INVALID_ARGUMENT, str(exc))
        owner = request.owner
        before = await self.reading(self.probe, owner, None)
        matched = before.outcome == P.IDENTITY_MATCHED
        if not matched and before.outcome not in probe_rules.PROVEN_DEAD:
            # Indeterminate: nothing here is proven to be this owner's, so nothing is signalled.
            return agent_pb2.KillOwnerResponse(result=await self.reading(self.probe_tree, owner, before))
        (watch,) = await self.watch([owner])
        killed = await self.readers.run(kill_tree, owner, self.variable, matched, self.cgroups, self.environ,
                                        Stopped())
        log.info("killed owner tree", extra={"fields": {"host": self.host_id, "pid": owner.pid,
                                                        "signalled": killed.sent}})
        if killed.refused:
            log.warning("signals refused: the tree may live on", extra={"fields": {
                "host": self.host_id, "pid": owner.pid, "refused": list(killed.refused)}})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(watch), timeout=request.wait_seconds or KILL_WAIT_S)
        # Signalled carriers take a moment to leave the process table; wait_seconds 0 means KILL_WAIT_S.
        deadline = time.monotonic() + (request.wait_seconds or KILL_WAIT_S)
        while True:
            result = await self.reading(self.probe_tree, owner, before)
            if result.tree_state == agent_pb2.TREE_GONE or time.monotonic() > deadline:
                if killed.refused:
                    # Said beside whatever the probe found: a refused signal ended nothing.
                    result.reason = (f"{result.reason}; the kernel refused {len(killed.refused)} signal(s) "
                                     f"({killed.refused[0]}): the agent needs CAP_KILL, and no LSM denial")
                return agent_pb2.KillOwnerResponse(result=result, signalled=killed.sent)
            await asyncio.sleep(0.01)
