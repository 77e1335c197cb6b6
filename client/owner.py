"""Being a session's writer: `Owner.start` spawns the gate, acquires (the grant committing the gate
as owner), and only then lets CMD run; `Owner.supervise` watches the record and ends the whole tree
when asked to let go.

Guarantee: CMD runs only after its commit succeeded — the gate is spawned with the spawn token in
its environment (the hash of a secret only this process holds), the coordinator has the host's
agent attest it (and move it into its session cgroup) before it decides anything, and writes it
as the owner in the grant's own transaction; where it could not (another token variable on this
host, an agent re-registered meanwhile) the grant is a reservation and CommitOwner commits the
gate, as before. Only then is the gate released; any failure before that ends it unrun. While CMD runs
the owner watches its record, reconnecting after every end that may pass (client.watch_rules): a
requested handoff, a force-pending takeover or a lost fence ends the whole tree (SIGTERM, grace,
stop, SIGKILL), and Release is sent with the grant once the tree is gone. The watch failing never
ends CMD, releases or writes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from holdfast.client import grantdir
from holdfast.client.acquire import RunSpec, Say, obtain, resolve_command, say_stderr, takeover_operation
from holdfast.client.connection import OWNED, Client
from holdfast.client.errors import ClientError
from holdfast.client.gate import Gate
from holdfast.client.grant import GRANT_FILE, Grant
from holdfast.client.tree import Tree, end_tree, left_of
from holdfast.common import env as cmd_env
from holdfast.common import files, identifiers, spawn_tokens
from holdfast.common.reasons import Reason
from holdfast.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:  # loaded by the runs that name a store or a --carry root: ~2 ms of every other start
    from holdfast.client import carry
    from holdfast.client.guards import Guard

RELEASE_RETRY_S = 30.0  # an agent restart: its lease lapses and its successor registers (~11 s measured)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                     signal.SIGUSR2, signal.SIGWINCH)


def cli_on_path(path: str) -> str:
    """`path` with this installation's `holdfast` reachable, so `holdfast put` inside `run` works when
    the CLI is not on PATH (a venv not activated). Appended, never prepended: the child's own
    `python` and tools stay the ones it would have found."""
    here = os.path.dirname(sys.executable)
    if shutil.which("holdfast", path=path) or not os.access(os.path.join(here, "holdfast"), os.X_OK):
        return path
    return f"{path}{os.pathsep}{here}" if path else here


def resume_of(record: pb.SessionRecord) -> dict[str, object]:
    """What the next owner resumes from, as the record had it at the grant: the provider and its
    handle chain, oldest first (each handle with the fence that recorded it)."""
    return {"provider": record.provider,
            "provider_handle_chain": [{"handle": link.handle, "minted_at_fence": link.minted_at_fence}
                                      for link in record.provider_handle_chain]}


def spawn_environment(session_id: str, coordinator: str, token_env: str, token: str,
                      base: dict[str, str] | None = None, tls_dir: Path | None = None,
                      guarded: Sequence[str] = ()) -> dict[str, str]:
    """CMD's environment as far as it is known before the grant: the token, the session, the
    guarded stores (one URL a line). What only the grant tells — the grant file's path too: its
    directory is made once granted — is set empty, so a value inherited from an enclosing run
    never leaks into this one."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = cli_on_path(env.get("PATH", os.defpath))
    if tls_dir is not None:
        env[cmd_env.TLS_DIR] = str(tls_dir)  # its `holdfast put` reaches the coordinator as `run` did
    env.update({
        token_env: token,
        cmd_env.SESSION: session_id,
        cmd_env.COORDINATOR: coordinator,
        cmd_env.GUARDS: "\n".join(guarded),
        **grant_environment(None, None),
    })
    return env


def grant_environment(grant: Grant | None, record: pb.SessionRecord | None,
                      grant_file: str = "") -> dict[str, str]:
    """What CMD's environment takes from its grant: the fence, where the grant file is, and the
    provider's newest handle to resume (empty when there is none)."""
    return {
        cmd_env.FENCE: str(grant.fence) if grant is not None else "",
        cmd_env.GRANT_FILE: grant_file,
        cmd_env.PROVIDER: record.provider if record is not None else "",
        cmd_env.PROVIDER_HANDLE: record.provider_handle_chain[-1].handle
        if record is not None and record.provider_handle_chain else "",
    }


def _made_dirs(spec: RunSpec) -> list[str]:
    """RunSpec.made_at_grant, from the run's working directory."""
    return [os.path.join(spec.cwd or os.getcwd(), directory) for directory in spec.made_at_grant]


def private_dirs(directories: Sequence[str], session_id: str, make: bool) -> None:
    """The directories a run makes once granted (RunSpec.made_at_grant): checked before anything is
    asked, making nothing (files.open_existing_private_path), then, with `make`, made once granted
    (files.open_private_path). INVALID_ARGUMENT for one that would not be this user's alone, in
    directories no other user may change."""
    for directory in directories:
        try:
            fd = files.open_private_path(directory) if make else files.open_existing_private_path(directory)
        except OSError as exc:
            then = "CMD did not run" if make else "nothing was made, nor a grant asked for"
            raise ClientError(Reason.INVALID_ARGUMENT, f"{exc.filename or directory}: {exc.strerror}: "
                              f"{directory}, which this run makes once granted, must be uid {os.geteuid()}'s "
                              f"alone, in directories no other user may change; {then}", session_id) from None
        if fd is not None:
            os.close(fd)


async def open_guards(urls: list[str]) -> list[Guard]:
    """Each --guard store connected, its marker storage in place; GUARD_UNREACHABLE otherwise."""
    if not urls:
        return []
    from holdfast.client import guards  # a run without --guard never loads the stores' module

    opened: list[Guard] = []
    try:
        for url in urls:
            opened.append(await asyncio.to_thread(guards.open_guard, url))
    except guards.GuardError as exc:
        for guard in opened:
            with contextlib.suppress(Exception):
                guard.close()
        raise ClientError(Reason.GUARD_UNREACHABLE, str(exc)) from None
    return opened


async def bump_guards(opened: list[Guard], grant: Grant) -> None:
    if not opened:
        return  # no thread to start: its start was 1.5 ms of every takeover's path to CMD
    from holdfast.client import guards  # loaded by open_guards already: a run without --guard never is

    try:
        await asyncio.to_thread(guards.bump_all, opened, grant.session_id, grant.fence)
    except guards.GuardError as exc:
        err = ClientError(Reason.GUARD_FAILED, str(exc), grant.session_id)
        err.fence = grant.fence
        raise err from None


def hand_terminal(pgid: int) -> int | None:
    """Makes `pgid` the terminal's foreground group when this process holds the terminal, so an
    interactive CMD can read it and gets Ctrl-C itself; returns the terminal fd to take back."""
    try:
        fd = sys.stdin.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return None
    except (OSError, ValueError):
        return None
    # A process group that is not in the foreground gets SIGTTOU for tcsetpgrp.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        return None
    finally:
        signal.signal(signal.SIGTTOU, previous)
    return fd


def status_of(returncode: int) -> int:
    """A shell's view of a child's end: its exit status, or 128 + the signal that ended it."""
    return 128 - returncode if returncode < 0 else returncode


class Owner:
    """A committed owner: the gate released, CMD running in its own process group."""

    def __init__(self, client: Client, spec: RunSpec, grant: Grant, gate: Gate, tree: Tree,
                 rundir: grantdir.RunDir, record: pb.SessionRecord, say: Say, terminal: int | None = None,
                 carried: Sequence[str] = (), seen: carry.Seen | None = None, cap: int = 0) -> None:
        self.client, self.spec, self.grant, self.gate, self.tree = client, spec, grant, gate, tree
        self.rundir, self.record, self.say, self.terminal = rundir, record, say, terminal
        self.carried = list(carried)  # --carry roots, as the manifest names them
        self.seen = seen or {}  # where each root stood when CMD started: its uploads require it there
        self.cap = cap  # the coordinator's per-session cap for them, as GetCarry said it at the start
        self.ended_by = ""   # "", "handoff" or "lost"
        self.carry_error: ClientError | None = None  # the last upload's failure, if it failed

    @classmethod
    async def start(cls, client: Client, spec: RunSpec, say: Say = say_stderr) -> Owner:
        resolve_command(spec.argv, spec.cwd)  # before Acquire or RequestHandoff, never after
        try:
            identifiers.check_acquire_texts(spec.provider, spec.location)  # likewise: as the coordinator
        except identifiers.InvalidInput as wrong:
            raise ClientError(Reason.INVALID_ARGUMENT, str(wrong), spec.session_id) from None
        made = _made_dirs(spec)
        private_dirs(made, spec.session_id, make=False)  # likewise; made only once granted
        carried: tuple[list[str], int, carry.Seen] = ([], 0, {})
        if spec.carry:
            from holdfast.client import carry  # packing and restoring: ~1.6 ms of a start without --carry

            carried = await carry.check_at_start(client, spec.session_id, spec.carry, spec.cwd or os.getcwd(),
                                                 [os.path.normpath(directory) for directory in made])
        guards = await open_guards(spec.guards)  # likewise: an unreachable store asks nothing of anyone
        try:
            # Likewise a temp directory the grant file may not be kept in: refused before any grant.
            where = grantdir.place()
            try:
                return await cls._start(client, spec, say, guards, carried, where)
            finally:
                where.close()
        finally:
            for guard in guards:
                with contextlib.suppress(Exception):
                    guard.close()

    @classmethod
    async def _obtain(cls, client: Client, spec: RunSpec, say: Say, gate: pb.GateSpawn,
                      token: str) -> tuple[Grant, pb.SessionRecord]:
        """The grant, committed to `gate` unless it is a reservation. A takeover keeps its operation
        id until granted, so it may replay an earlier `run`'s grant, committed to that run's gate:
        that grant is released (refused while the earlier gate or its tree lives) and the same
        operation asked again, which a released grant is not replayed to."""
        if not spec.takeover:
            return await obtain(client, spec, spawn_tokens.random_hex(16), say, gate)
        operation_id, kept = takeover_operation(spec.session_id, client.host_id)
        if kept is None:
            say("the takeover's operation id cannot be kept (no writable state directory): a retry "
                "from another process would not continue this request")
        grant, granted = await obtain(client, spec, operation_id, say, gate)
        owner = granted.lease.owner
        if granted.lease.claim_status in OWNED and owner.spawn_token != token:
            say(f"this takeover's operation was granted at fence {grant.fence} to an earlier `run` (its "
                f"gate, pid {owner.pid}); releasing that grant and asking again")
            try:
                await client.release(grant)
            except ClientError as err:
                if err.reason == Reason.TREE_ALIVE:
                    err.message = (f"fence {grant.fence} was granted to this takeover's operation for an "
                                   f"earlier `run`, whose CMD (pid {owner.pid} on {owner.host_id}) still "
                                   f"runs; end it, or remove {kept or 'the kept operation id'} to ask anew")
                raise
            grant, granted = await obtain(client, spec, operation_id, say, gate)
        if kept is not None:
            kept.unlink(missing_ok=True)
        return grant, granted

    @classmethod
    async def _start(cls, client: Client, spec: RunSpec, say: Say, guards: list[Guard],
                     carried: tuple[list[str], int, carry.Seen], where: grantdir.Place) -> Owner:
        rundir: grantdir.RunDir | None = None
        held = -1
        secret = spawn_tokens.mint_spawn_secret()
        token, token_env = spawn_tokens.spawn_token_for(secret), spawn_tokens.expected_variable()
        guarded = [guard.url for guard in guards]
        gate: Gate | None = None
        grant: Grant | None = None

        def spawn(variable: str, value: str) -> Gate:
            env = spawn_environment(spec.session_id, client.address, variable, value,
                                    tls_dir=client.tls_dir, guarded=guarded)
            return Gate(spec.argv, env, cwd=spec.cwd, process_group=0, env_at_release=True)

        try:
            # Spawned before the Acquire, still blocked on its pipe, so that the coordinator can have
            # the host's agent attest it (and move it into a session cgroup of the agent's making:
            # every descendant is born in it) before deciding, and commit it with the grant.
            gate = spawn(token_env, token)
            grant, granted = await cls._obtain(client, spec, say, pb.GateSpawn(
                pid_hint=gate.pid, token_secret=secret, spawn_token_env=token_env), token)
            if granted.lease.claim_status in OWNED:
                if granted.lease.owner.spawn_token != token:  # not ours: never released, nothing runs
                    other = granted.lease.owner.pid
                    raise ClientError(Reason.STALE_FENCE, f"fence {grant.fence} was committed to another "
                                      f"gate (pid {other}), not this run's", spec.session_id)
                record = granted
            else:
                if (grant.spawn_token, grant.spawn_token_env) != (token, token_env):
                    # This host's agent reads another variable (or this is an earlier run's grant,
                    # replayed): a gate with the grant's token, under the agent's variable, instead.
                    gate.abort()
                    await asyncio.to_thread(gate.process.wait)
                    gate = spawn(grant.spawn_token_env, grant.spawn_token)
                record = await client.commit(grant, gate.pid, gate.is_process)
            # Made only once granted (mode 0700, held open; a dead run's is removed by the next one):
            # a refused run makes nothing and removes nothing. What place() checked may fail since
            # (a full or remounted file system): said as such, the grant released, no traceback.
            try:
                rundir, held = grantdir.make(where)
                grant.write(held, resume_of(granted))
            except OSError as exc:
                raise grantdir.unmade(where, exc, grant.fence, spec.session_id) from None
            # The new fence reaches every guarded store before CMD can write anything.
            await bump_guards(guards, grant)
            # Made only now, before a carried copy is restored in them: a refused run leaves none.
            private_dirs(_made_dirs(spec), spec.session_id, make=True)
            names, cap, seen = carried
            if names:
                from holdfast.client import carry  # loaded by start already: names come from --carry

                cwd = spec.cwd or os.getcwd()
                seen = await carry.restore_before_exec(client, grant, names, cwd, cap, say, seen)
        except BaseException as exc:
            if gate is not None:
                gate.abort()
                await asyncio.to_thread(gate.process.wait)
            released = "was released"
            if grant is not None:
                try:
                    await client.release(grant)  # its gate ended unrun: lets the next caller in at once
                except ClientError as err:
                    released = f"could not be released: {err.reason}: {err.message}"
            if rundir is not None:
                rundir.remove()
            if isinstance(exc, ClientError) and exc.reason == Reason.GRANT_DIR_FAILED:
                exc.message += f"; fence {exc.fence} {released}"
                if spec.takeover:
                    # The handoff is the takeover's committed first step: the grant came after it.
                    exc.message += ("; this takeover's handoff, its first step, had already ended the "
                                    "session's previous owner, if it had one: that is not undone")
            raise
        finally:
            if held >= 0:
                os.close(held)
        tree = Tree.of_gate(grant.spawn_token_env, grant.spawn_token, gate.pid)  # before CMD can move
        terminal = hand_terminal(gate.pid)
        gate.release(grant_environment(grant, granted, os.path.join(rundir.path, GRANT_FILE)))
        owner = record.lease.owner
        say(f"session {grant.session_id} fence {grant.fence}: running on host {owner.host_id} "
            f"as pid {owner.pid}")
        if not owner.cgroup.path:
            say(f"no session cgroup on host {owner.host_id} ({owner.tree_proof_reason}): the tree's end "
                "is proven by its spawn token alone, and a process that drops it is not found")
        return cls(client, spec, grant, gate, tree, rundir, record, say, terminal, names, seen, cap)

    async def _watch(self) -> None:
        """Returns once the record asks this owner to end: a handoff request, or the fence lost. An
        end of the watch that may pass (client.watch_rules: a coordinator away, TOO_MANY_CALLS while
        its silenced call is still counted) is asked again, said once and once more when it is back:
        an owner that stopped watching would never hear a handoff request, a takeover or a drain."""
        sid = self.grant.session_id

        def lost(err: ClientError) -> None:
            self.say(f"lost the watch of session {sid}'s record ({err.reason}: {err.message}); CMD keeps "
                     "running, reconnecting")

        def back() -> None:
            self.say(f"watching session {sid}'s record again")

        try:
            async for record in self.client.watch(sid, self.grant, self.grant.revision, lost, back):
                if self._ends(record.lease):
                    return
        except ClientError as err:
            if err.reason != Reason.WRONG_CLUSTER:
                raise
            # This owner can no longer see its own record, so it cannot hear a handoff request.
            self.ended_by = "lost"
            self.say(f"{err.message}; ending the tree")

    def _ends(self, lease: pb.Lease) -> bool:
        """Whether this lease asks the owner to end its tree (and says why)."""
        if lease.fence != self.grant.fence or lease.claim_status not in OWNED:
            self.ended_by = "lost"
            self.say(f"session {self.grant.session_id} is no longer held at fence {self.grant.fence} "
                     f"(now fence {lease.fence}); ending the tree")
            return True
        if lease.handoff_stage in (pb.HANDOFF_REQUESTED, pb.FORCE_PENDING):
            self.ended_by = "handoff"
            by = lease.handoff_requested_by_host
            # A drain names itself ("drain of H"); a takeover names the host it came from.
            self.say(f"handoff requested by {by if by.startswith('drain of ') else 'host ' + by}; ending "
                     f"the tree (grace {self.spec.grace:g}s)")
            return True
        return False

    def _forward(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.gate.pid, sig)

    async def supervise(self, forward_signals: bool = False) -> int:
        """Until CMD's tree is gone and released; returns CMD's status as a shell reports it. With
        `forward_signals` (the CLI's), the signals `holdfast run` forwards go to CMD's process group
        from this loop's handlers; a library caller's own handlers are left alone by default.
        Cancelled (a Ctrl-C that came before the signals were forwarded, or the caller's cancel),
        it ends the tree and releases the grant, then lets the cancel go on: a cancel never leaves
        the session held by a tree nobody supervises."""
        loop = asyncio.get_running_loop()
        if forward_signals:
            # Kept until the release is sent: a Ctrl-C after CMD's end (SIGINT then restores to
            # raising KeyboardInterrupt anywhere) left the record live with a dead pid.
            for sig in FORWARDED_SIGNALS:
                loop.add_signal_handler(sig, self._forward, sig)
        try:
            return await self._supervise(loop)
        finally:
            if forward_signals:
                for sig in FORWARDED_SIGNALS:
                    loop.remove_signal_handler(sig)

    async def _supervise(self, loop: asyncio.AbstractEventLoop) -> int:
        pidfd = os.pidfd_open(self.gate.pid)
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        watcher = asyncio.create_task(self._watch())
        ended = False  # the tree proven gone by the handoff's end_tree: nothing of it can come back
        cancelled = False
        checkpoints = (asyncio.create_task(self._checkpoints()) if self.carried and self.spec.carry_every
                       else None)
        try:
            await asyncio.wait({exited, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done():
                if watcher.exception() is not None:
                    # Only an answer no retry can change ends the watch (client.watch_rules); CMD is
                    # not this run's to end for it, and nothing is released or written.
                    self.say(f"stopped watching the record for good ({watcher.exception()}): asking again "
                             "cannot change that answer; CMD keeps running, and this run will not hear a "
                             "handoff request, a takeover or a drain of it")
                elif self.ended_by:
                    # The cgroup's members get SIGTERM from here, not once a worker thread has
                    # started (~1 ms of every handoff); end_tree sends it to any other carrier.
                    termed = self.tree.signal(signal.SIGTERM, self.tree.cgroup_members())
                    ended = await asyncio.to_thread(end_tree, self.tree, self.spec.grace, termed)
            await exited
        except asyncio.CancelledError:
            cancelled = True
            self.say(f"interrupted; ending the tree (grace {self.spec.grace:g}s) and releasing")
            ended = await asyncio.to_thread(end_tree, self.tree, self.spec.grace)
        finally:
            watcher.cancel()
            if checkpoints is not None:
                checkpoints.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checkpoints
            loop.remove_reader(pidfd)
            os.close(pidfd)
        # Cancelled, the gate is waited for only once end_tree proved the tree (and so it) gone.
        status = status_of(self.gate.process.wait()) if ended or not cancelled else 0
        try:
            await self.finish(ended)
        finally:
            self.cleanup()
        if cancelled:
            raise asyncio.CancelledError
        return status

    async def upload_carried(self, reason: str) -> bool:
        """Packs and uploads the --carry roots under this grant; says what failed (the session's last
        good copy then stands) and returns whether the new copy was committed."""
        from holdfast.client import carry  # only a --carry run uploads, and its start loaded it

        cwd = self.spec.cwd or os.getcwd()
        try:
            packed = await asyncio.to_thread(carry.pack, self.carried, cwd, self.grant.session_id,
                                             self.seen, self.cap)
            for line in packed.skipped:
                self.say(f"not carried: {line}")
            if not packed.manifest.roots:  # none existed at the start and CMD made none
                return True
            await carry.upload(self.client, self.grant, packed, reason)
        except ClientError as err:
            self.carry_error = err
            self.say(f"carried state not uploaded ({err.reason}): {err.message}; the session keeps its last "
                     "good copy")
            return False
        self.carry_error = None
        if reason != "checkpoint":
            roots = ", ".join(map(carry.shown_root, self.carried))
            self.say(f"carried {roots} ({packed.manifest.total_bytes} bytes) at fence {self.grant.fence}")
        return True

    async def _checkpoints(self) -> None:
        """--carry-every: a copy of the roots every so often while CMD runs, so an owner that dies
        without releasing (a host lost) leaves a recent copy. Files being written at that moment
        may be caught mid-write: a file seen changing is refused and the next checkpoint tries again."""
        while True:
            await asyncio.sleep(self.spec.carry_every)
            await self.upload_carried("checkpoint")

    async def finish(self, ended: bool = False) -> None:
        """End what is left of the tree (unless `ended`: proven gone already, so no member is left
        to fork another), upload the carried state, then Release; a fence already moved on needs
        no release (and could store nothing)."""
        if not ended and not await asyncio.to_thread(end_tree, self.tree, self.spec.grace):
            left = await asyncio.to_thread(left_of, self.tree)
            self.say(f"the session's tree did not end ({left}); not releasing")
            return
        if self.carried and self.ended_by == "lost":
            self.say(f"carried state not uploaded: fence {self.grant.fence} is no longer the session's; the "
                     "session keeps the copy its owners last committed")
        elif self.carried:
            await self.upload_carried("handoff" if self.ended_by == "handoff" else "release")
        deadline = asyncio.get_running_loop().time() + RELEASE_RETRY_S
        delay, asked_again = 0.1, False
        while True:
            try:
                await self.client.release(self.grant)
                self.say(f"session {self.grant.session_id} released at fence {self.grant.fence}")
                return
            except ClientError as err:
                if err.reason == Reason.STALE_FENCE:
                    self.say(f"session {self.grant.session_id} has moved past fence {self.grant.fence}; "
                             "nothing to release")
                    return
                # The tree is gone by our own check, so an answer that only could not prove it
                # (OWNERSHIP_UNKNOWN: the host's agent restarting or re-registering, or its scan not
                # settling on a busy host, or a process it could not read) is asked again for a while
                # rather than leave the session held and exit 75. Each try is the agent's proof again,
                # never assumed. TREE_ALIVE is the agent seeing a member alive that our check could
                # not (a carrier whose environ this process may not read, another user's): it stays
                # until someone ends it, so asking again would only hold the user RELEASE_RETRY_S
                # longer for the same answer; it is said at once, with what to end.
                if err.reason != Reason.OWNERSHIP_UNKNOWN or asyncio.get_running_loop().time() > deadline:
                    raise
                if not asked_again:
                    self.say(f"release refused ({err.reason}): {err.message}; asking again for up to "
                             f"{RELEASE_RETRY_S:.0f} s")
                    asked_again = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def cleanup(self) -> None:
        if self.terminal is not None:
            previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.terminal, os.getpgrp())
            signal.signal(signal.SIGTTOU, previous)
        self.rundir.remove()


async def run(spec: RunSpec, address: str | None = None, host_id: str | None = None,
              say: Say = say_stderr, forward_signals: bool = False) -> int:
    """`holdfast run`: CMD's status, or raises ClientError (nothing ran)."""
    async with Client(address, host_id) as client:
        owner = await Owner.start(client, spec, say)
        return await owner.supervise(forward_signals)
