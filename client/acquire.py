"""How `holdfast run` obtains a session: once, waiting (`--wait`), or as a takeover that asks the
owner to let go and then, with `--force`, has the owner's agent end it.

Guarantee: CMD is resolved (PATH, executable bit) before anything is asked of the coordinator, so a
typo never ends an owner; a takeover keeps its operation id (mode 0600, per host and session) until
granted, so a retry continues the same request; waiting between calls is on record changes, never
on a polling timer; the owner is asked to let go by the takeover's Acquire itself, only once this
run's gate is attested and the grant's gates are open; `--force` is sent only with the handoff
request it continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from holdfast.client import grantdir
from holdfast.client.connection import OWNED, Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.common import files, identifiers, reasons, spawn_tokens
from holdfast.common.reasons import Reason
from holdfast.proc.ending import KILL_WAIT_S
from holdfast.v1 import coordinator_pb2 as pb

MAX_WAIT_S = 3600.0
CARRY_SETTLE_S = 10.0  # how long a --carry run waits for an ended owner's upload and release
Say = Callable[[str], None]


def say_stderr(line: str) -> None:
    print(f"holdfast: {line}", file=sys.stderr, flush=True)


def resolve_command(argv: list[str], cwd: str | None = None, path: str | None = None) -> str:
    """Where CMD's program is, as the gate's `exec` will find it (PATH lookup for a bare name,
    the executable bit for a path), or ClientError CMD_NOT_FOUND / CMD_NOT_EXECUTABLE. Checked
    before anything is asked of the coordinator: a typo must not cost a live owner its session
    (`run --takeover -- <typo>` would end the owner, then fail to exec)."""
    name = argv[0] if argv else ""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    nothing = "nothing was asked of the session's owner and nothing was written"
    if "/" in name:
        program = os.path.join(cwd or os.getcwd(), name)
        if not os.path.exists(program):
            raise ClientError(Reason.CMD_NOT_FOUND, f"{name}: no such file; {nothing}")
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise ClientError(Reason.CMD_NOT_EXECUTABLE, f"{name}: not an executable file; {nothing}")
        return program
    found = shutil.which(name, path=search) if name else None
    if found is not None:
        return found
    # As the shell: a file by that name on PATH that cannot be executed is 126, none at all is 127.
    if name and any(os.path.isfile(os.path.join(d or ".", name)) for d in search.split(os.pathsep)):
        raise ClientError(Reason.CMD_NOT_EXECUTABLE,
                          f"{name}: found on PATH but not executable; {nothing}")
    raise ClientError(Reason.CMD_NOT_FOUND, f"{name or '(empty)'}: command not found on PATH; {nothing}")


@dataclass
class RunSpec:
    """What `holdfast run` asks for; the library's callers fill the same fields."""

    session_id: str
    argv: list[str]
    provider: str = ""
    location: str = ""
    takeover: bool = False
    force: bool = False
    handoff_timeout: float = 30.0
    wait: float = 0.0
    grace: float = 10.0
    cwd: str | None = None
    guards: list[str] = field(default_factory=list)  # stores whose fence marker reaches fence N before CMD
    carry: list[str] = field(default_factory=list)   # files and directories that move with the session
    carry_every: float = 0.0                          # seconds between checkpoints of them (0: none)
    # Directories made (this user's alone: files.open_private_path) once granted, before a carried
    # copy is restored — a provider CLI's state directory: checked before anything is asked, so a
    # refused run leaves none behind.
    made_at_grant: list[str] = field(default_factory=list)


def takeover_operation(session_id: str, host_id: str) -> tuple[str, Path | None]:
    """The operation id of this host's takeover of the session, kept (mode 0600) until granted.

    The coordinator admits one handoff request per session, under its operation id; a takeover
    that gave up leaves its request standing, so the next try from this host must continue it
    under the same id rather than be refused as a conflicting operation.
    """
    name = f"{host_id}.{session_id}"
    for base in _takeover_dirs():
        try:
            # Made if missing, then read and written through this one descriptor: a directory of
            # this user's alone, reached through no link another user made or may swap
            # (files.open_private_path) — a root run with another user's HOME never follows that
            # user's `~/.local/state` link to write, and a temp dir another user made first is
            # refused.
            directory = files.open_private_path(base, mode=0o700)
        except OSError:
            continue  # refused, or a read-only home (a pod's): the next place, or none
        try:
            kept = _kept(directory, name)
            if kept is not None:
                return kept, base / name
            operation_id = spawn_tokens.random_hex(16)
            files.write_whole(directory, name, operation_id.encode())
        except OSError:
            continue
        finally:
            os.close(directory)
        return operation_id, base / name
    # Nowhere to keep it: this takeover goes on under a fresh id; a retry by another process would
    # be refused OPERATION_CONFLICT until this request is granted or recovered, never granted twice.
    return spawn_tokens.random_hex(16), None


def _kept(directory: int, name: str) -> str | None:
    """The operation id kept as `name` in the directory open as `directory`; None when there is
    none, or it is not a regular file of this user's alone (never read through a link)."""
    try:
        fd = files.open_private_file(directory, name, os.O_RDONLY)
    except OSError:
        return None
    with open(fd, "rb") as f:
        kept = f.read(256).decode(errors="replace").strip()
    return kept if identifiers.OPERATION_ID.fullmatch(kept) else None


def _takeover_dirs() -> list[Path]:
    """Where a takeover's operation id is kept: the user's state home, else a private temp dir."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return [Path(state_home) / "holdfast" / "takeovers",
            Path(grantdir.temp_dir()) / f"holdfast-{os.getuid()}" / "takeovers"]


def held_hint(spec: RunSpec) -> str:
    """HELD's next step after what this run already tried: never --takeover again after a failed
    --takeover, nor --wait after --wait ran out."""
    if spec.takeover and not spec.force:
        return (f"the owner did not let go within --handoff-timeout {spec.handoff_timeout:g}s; add `--force` "
                "to have its host's agent end its tree, or allow longer with --handoff-timeout (it was "
                "asked, and its `run` may still end its tree after its own --grace, leaving the session "
                "free)")
    if spec.wait and not spec.takeover:
        return (f"still held after --wait {spec.wait:g}s; wait longer, or ask for it with `--takeover` "
                "(add `--force` to have its host's agent end the old tree)")
    return ""


async def until_released(client: Client, session_id: str, timeout: float) -> None:
    """Returns once the record is released or moved to another fence (the record as it is now counts:
    a release just before the watch opened is not waited for), or after `timeout` seconds."""

    async def released() -> None:
        fence = None
        async for record in client.watch(session_id):  # the record now, then at every change
            fence = record.lease.fence if fence is None else fence
            if record.lease.fence != fence or record.lease.claim_status not in OWNED:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(released(), max(timeout, 0.0))


async def _next_record(changes: AsyncGenerator[pb.SessionRecord, None], timeout: float) -> None:
    """Returns at the watch's next record, when it ends, or after `timeout` seconds."""
    with contextlib.suppress(TimeoutError, StopAsyncIteration):
        await asyncio.wait_for(anext(changes), max(timeout, 0.0))


async def obtain(client: Client, spec: RunSpec, operation_id: str, say: Say = say_stderr,
                 gate: pb.GateSpawn | None = None) -> tuple[Grant, pb.SessionRecord]:
    """`_obtain`, with a refusal's next step fitted to this run: what it tried, the fence it met."""
    try:
        return await _obtain(client, spec, operation_id, say, gate)
    except ClientError as err:
        if err.reason == Reason.HELD:
            err.hint = held_hint(spec)
        elif err.reason in (Reason.OWNERSHIP_UNKNOWN, Reason.MANUAL_RECOVERY):
            with contextlib.suppress(ClientError):  # best effort: the hint then says N
                err.fence = (await client.get_session(spec.session_id)).record.lease.fence
        raise


async def _obtain(client: Client, spec: RunSpec, operation_id: str, say: Say = say_stderr,
                  gate: pb.GateSpawn | None = None) -> tuple[Grant, pb.SessionRecord]:
    """Acquire as the spec says: once; or waiting (`--wait`, the coordinator holds the call on the
    owner's exit); or as a takeover that asks the owner to let go, then — with force — has the
    owner's agent end it. Waiting between calls is on record changes, never on a polling timer."""
    loop = asyncio.get_running_loop()
    budget = spec.wait or (spec.handoff_timeout if spec.takeover else 0.0)
    deadline = loop.time() + budget
    # With --carry, an owner whose tree has ended but who has not released is, as far as anyone can
    # tell, its `run` uploading the state this run restores: granting over it would refuse that
    # upload. The coordinator is asked not to (RELEASE_PENDING) until CARRY_SETTLE_S after it first
    # said so; then the copy that owner last committed is what this run restores.
    settle_until: float | None = None
    if spec.takeover:
        # The Acquire asks the owner itself, once this run's gate is attested: no RequestHandoff
        # round trip first, and a takeover refused before that asks nothing of the owner.
        say(f"takeover of {spec.session_id}: asking its owner, if any, to let go; waiting up to "
            f"{budget:g}s")
    # A waiting run's next Acquire is judged after the record's watch has opened: a change after
    # the record that Acquire judged is then on that watch, never taken for its opening record.
    changes: AsyncGenerator[pb.SessionRecord, None] | None = None
    try:
        while True:
            left = max(deadline - loop.time(), 0.0)
            try:
                return await client.acquire(spec.session_id, operation_id, provider=spec.provider,
                                            location=spec.location, wait_seconds=min(left, MAX_WAIT_S),
                                            takeover=spec.takeover, await_release=bool(spec.carry) and (
                                                settle_until is None or loop.time() < settle_until),
                                            gate=gate, hold=True)
            except ClientError as err:
                if not reasons.waitable(err.reason):
                    raise
                if err.reason == Reason.RELEASE_PENDING:
                    if settle_until is None:
                        settle_until = loop.time() + CARRY_SETTLE_S
                        say(f"the owner of {spec.session_id} has ended; waiting up to {CARRY_SETTLE_S:g}s "
                            "for it to upload its carried state and release")
                    await until_released(client, spec.session_id, settle_until - loop.time())
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    if spec.force and err.reason != Reason.RESERVED:
                        break
                    raise
                # e.g. the owner's root exited but its tree is still ending: the next change decides.
                # Without a watch opened before this Acquire, a change may already have landed since
                # it was judged: the watch opens now and the next Acquire follows at once.
                if changes is not None:
                    await _next_record(changes, left)
                    await changes.aclose()
                changes = client.watch(spec.session_id)
                await _next_record(changes, deadline - loop.time())  # its opening record
    finally:
        if changes is not None:
            await changes.aclose()
    # The kill's own wait, then this run's --grace for the owner's exit: an answer that proves
    # neither its end nor its life (its agent slow to answer, its tree still ending) is waited on
    # rather than refused at once, after the kill was asked.
    force_wait = min(KILL_WAIT_S + spec.grace, MAX_WAIT_S)
    say(f"the owner of {spec.session_id} did not let go in {budget:g}s; asking its host's agent to end it "
        f"(waiting up to {force_wait:g}s for the proof)")
    return await client.acquire(spec.session_id, operation_id, provider=spec.provider,
                                location=spec.location, wait_seconds=force_wait, takeover=True, force=True,
                                gate=gate, hold=True)
