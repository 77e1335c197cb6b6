"""The client library (`holdfast.client.connection`): be a session's single writer from Python.

Guarantee: CMD runs only after its CommitOwner succeeded — `Owner.start` acquires, spawns the
gate with the spawn token in its environment, has the coordinator's agent attest it, and only then
releases the gate; any failure before that ends the gate unrun. While CMD runs, the owner watches
its record: a requested handoff or a lost fence ends the whole tree (SIGTERM, grace, SIGKILL),
and Release is sent with the grant once the tree is gone. Calls are retried with tenacity only
where a retry is safe: Acquire replays by operation id, and a retried commit or release that finds
its own effect already applied counts as done. The client never calls an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from holdfast.client.gate import Gate
from holdfast.client.tree import Tree, end_tree
from holdfast.common import reasons, tls, upstate
from holdfast.common.reasons import Reason, reason_of
from holdfast.common.tls import Role
from holdfast.coordinator import records
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc

CALL_TIMEOUT_S = 10.0
RETRY_BUDGET_S = 5.0
MAX_WAIT_S = 3600.0
OWNED = (pb.COMMITTED, pb.LIVE)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                     signal.SIGUSR2, signal.SIGWINCH)

Say = Callable[[str], None]


def coordinator_address(explicit: str | None = None) -> str:
    return explicit or os.environ.get("HOLDFAST_COORDINATOR") or upstate.DEFAULT_COORDINATOR


def local_host_id(explicit: str | None = None) -> str:
    """The id this host's agent registered under (`holdfast exec --host N` sets HOLDFAST_HOST_ID)."""
    return explicit or os.environ.get("HOLDFAST_HOST_ID") or os.uname().nodename


def say_stderr(line: str) -> None:
    print(f"holdfast: {line}", file=sys.stderr, flush=True)


class ClientError(Exception):
    """A refusal or failure with its reason, exit code and next step."""

    def __init__(self, reason: str, message: str, session: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.session = session
        self.retried = False  # set when an earlier try of the same call may have landed
        self.fence = 0  # the session's current fence, when known: the next step names it
        self.hint = ""  # a next step that fits what the caller already tried, instead of the table's

    @property
    def exit_code(self) -> int:
        return reasons.exit_code(self.reason)

    @property
    def next_step(self) -> str:
        return self.hint or reasons.next_step(self.reason, self.session, self.fence)

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}. Next: {self.next_step}"


def _unanswered(exc: BaseException, *marks: str) -> bool:
    """A call no coordinator answered (no ErrorInfo), whose transport error mentions one of `marks`."""
    if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    if reason_of(exc):
        return False
    details = (exc.details() or "").lower()
    return any(mark in details for mark in marks)


def _handshake_failed(exc: BaseException) -> bool:
    return _unanswered(exc, "handshake failed")


def _refused(exc: BaseException) -> bool:
    return _unanswered(exc, "connection refused")


def _classify(exc: grpc.aio.AioRpcError, session: str, address: str, plaintext: bool = False) -> ClientError:
    reason = reason_of(exc)
    if not reason:
        code = exc.code()
        if _handshake_failed(exc):
            # Issue 17: a wrong CA (or TLS to a plaintext coordinator) said "no coordinator".
            # gRPC's text ends with OpenSSL's own words, e.g. "...: certificate signature failure: OK".
            words = (exc.details() or "").removesuffix(": OK").rsplit(": ", 1)[-1][:200]
            return ClientError(Reason.TLS_HANDSHAKE_FAILED, f"the TLS handshake with {address} failed "
                               f"({words})", session)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            why = "nothing listens there" if _refused(exc) else code.name
            if plaintext and _unanswered(exc, "socket closed"):
                why = "it closed the connection, as a TLS-only coordinator does to plaintext: pass --tls-dir"
            return ClientError(Reason.UNREACHABLE, f"no answer from the coordinator at {address} "
                               f"({why})", session)
        reason = code.name
    return ClientError(reason, exc.details() or reason, session)


def _transient(exc: BaseException) -> bool:
    # UNAVAILABLE is both "no coordinator" and "the coordinator cannot reach etcd": nothing was written.
    # A failed handshake is the certificates', and does not heal by retrying.
    return (isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE
            and not _handshake_failed(exc))


@dataclass(frozen=True)
class Grant:
    """A grant: the fence and secret every owner write carries. The secret is never printed."""

    session_id: str
    fence: int
    secret: str = field(repr=False)
    spawn_token: str = field(repr=False)
    spawn_token_env: str
    coordinator: str
    # The holdfast cluster that minted it ('' from an older coordinator; grant files written before
    # the field existed read back as ''): sent with every write, checked in every answer.
    cluster_id: str = ""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Grant:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, directory: str) -> str:
        """A mode-0600 file the child can read to make fenced writes."""
        path = os.path.join(directory, "grant.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f)
        return path


def same_cluster(grant: Grant, answered_by: str) -> None:
    """Every answer of one run must come from the cluster that minted its grant: another one means
    two holdfast clusters answer one address (issue 17). '' is an older coordinator's answer."""
    if grant.cluster_id and answered_by and answered_by != grant.cluster_id:
        raise ClientError("WRONG_CLUSTER", f"the coordinator at {grant.coordinator} answered for holdfast "
                          f"cluster {answered_by[:64]!r}, but fence {grant.fence} was granted by cluster "
                          f"{grant.cluster_id!r}", grant.session_id)


def client_tls_dir(explicit: str | os.PathLike[str] | None, address: str) -> Path | None:
    """--tls-dir, else $HOLDFAST_TLS_DIR, else the certificates of the `holdfast up --tls` whose
    coordinator is `address` (holdfast.common.upstate); None = plaintext."""
    chosen = tls.tls_dir(explicit)
    return chosen if chosen is not None else upstate.tls_dir_for(address)


class Client:
    """One channel to a coordinator, with the calls a runtime and an operator need."""

    def __init__(self, address: str | None = None, host_id: str | None = None,
                 tls_dir: str | os.PathLike[str] | None = None, role: str = "client") -> None:
        """`role` picks the certificate presented with TLS (`<role>.pem` in the directory): a
        runtime is `client`; the operator commands present `operator` (DESIGN.md §4)."""
        self.address = coordinator_address(address)
        self.host_id = local_host_id(host_id)
        self.tls_dir = client_tls_dir(tls_dir, self.address)
        try:
            self.channel = tls.open_channel(self.address, self.tls_dir, Role(role))
        except FileNotFoundError as missing:  # its message names the file and how to make it
            raise ClientError(Reason.TLS_FILE_MISSING, str(missing)) from None
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        # Until some call was answered, a refused connection means nothing listens at the address:
        # say so at once (issue 17: 5.8 s of retries). Once answered, a refusal is a coordinator
        # restarting under a run, and the retry budget rides over it.
        self.answered = False

    def _retryable(self, exc: BaseException) -> bool:
        return _transient(exc) and (self.answered or not _refused(exc))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method, request, session: str = "", timeout: float = CALL_TIMEOUT_S,  # type: ignore[no-untyped-def]
                    retry: bool = True):
        """One RPC, retried while nothing answers (`retry` only for calls that are safe to repeat).
        A ClientError says whether an earlier try was sent, whose effect may have landed."""
        tries = 0
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(self._retryable if retry else lambda _exc: False), reraise=True,
                stop=stop_after_delay(RETRY_BUDGET_S), wait=wait_exponential(multiplier=0.05, max=1.0),
            ):
                with attempt:
                    tries += 1
                    response = await method(request, timeout=timeout)
                    self.answered = True
                    return response
        except grpc.aio.AioRpcError as exc:
            self.answered = self.answered or bool(reason_of(exc))
            error = _classify(exc, session, self.address, plaintext=self.tls_dir is None)
            error.retried = tries > 1
            raise error from None
        raise AssertionError("unreachable: tenacity reraises")

    # --- owner calls ---------------------------------------------------------------------
    async def acquire(self, session_id: str, operation_id: str, *, provider: str = "", location: str = "",
                      wait_seconds: float = 0.0, takeover: bool = False, force: bool = False,
                      live_on_commit: bool = True) -> tuple[Grant, pb.SessionRecord]:
        request = pb.AcquireRequest(
            session_id=session_id, provider=provider, location=location, operation_id=operation_id,
            host_id=self.host_id, live_on_commit=live_on_commit, wait_seconds=wait_seconds,
            takeover=takeover, force=force,
        )
        # A replay with the same operation id returns the first grant, so the retry is safe.
        response = await self._call(self.stub.Acquire, request, session_id, wait_seconds + CALL_TIMEOUT_S)
        g = response.grant
        grant = Grant(g.session_id, g.fence, g.secret, g.spawn_token, g.spawn_token_env, self.address,
                      g.cluster_id)
        return grant, response.record

    async def request_handoff(self, session_id: str, operation_id: str) -> pb.SessionRecord | None:
        """None when the session has no record yet (nothing to hand off)."""
        request = pb.RequestHandoffRequest(session_id=session_id, operation_id=operation_id,
                                           host_id=self.host_id)
        try:
            return (await self._call(self.stub.RequestHandoff, request, session_id)).record
        except ClientError as err:
            if err.reason == "NOT_FOUND":
                return None
            raise

    async def commit(self, grant: Grant, pid_hint: int) -> pb.SessionRecord:
        request = pb.CommitOwnerRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                        pid_hint=pid_hint, cluster_id=grant.cluster_id)
        try:
            response = await self._call(self.stub.CommitOwner, request, grant.session_id)
            same_cluster(grant, response.cluster_id)
            return response.record
        except ClientError as err:
            # A retried commit whose first try landed finds no reservation: check that it is ours.
            record = await self._own_effect(grant, err, lambda lease: lease.claim_status in OWNED and
                                            lease.owner.spawn_token == grant.spawn_token)
            if record is None:
                raise
            return record

    async def release(self, grant: Grant) -> pb.SessionRecord:
        request = pb.ReleaseRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                    cluster_id=grant.cluster_id)
        try:
            response = await self._call(self.stub.Release, request, grant.session_id)
            same_cluster(grant, response.cluster_id)
            return response.record
        except ClientError as err:
            record = await self._own_effect(grant, err, lambda lease: lease.claim_status == pb.RELEASED)
            if record is None:
                raise
            return record

    async def _own_effect(self, grant: Grant, err: ClientError,
                          applied: Callable[[pb.Lease], bool]) -> pb.SessionRecord | None:
        # Only a retry can find its own first try's effect; otherwise the effect is someone else's.
        if err.reason != "STALE_FENCE" or not err.retried:
            return None
        record = (await self.get_session(grant.session_id)).record
        return record if record.lease.fence == grant.fence and applied(record.lease) else None

    async def fenced_put(self, grant: Grant, key: str, value: bytes) -> int:
        request = pb.FencedPutRequest(session_id=grant.session_id, fence=grant.fence, secret=grant.secret,
                                      key=key, value=value, cluster_id=grant.cluster_id)
        response = await self._call(self.stub.FencedPut, request, grant.session_id)
        same_cluster(grant, response.cluster_id)
        return response.revision

    async def record_provider_handle(self, grant: Grant, handle: str) -> pb.SessionRecord:
        request = pb.RecordProviderHandleRequest(session_id=grant.session_id, fence=grant.fence,
                                                 secret=grant.secret, handle=handle,
                                                 cluster_id=grant.cluster_id)
        # Not retried: a second try whose first landed would append the handle twice.
        response = await self._call(self.stub.RecordProviderHandle, request, grant.session_id, retry=False)
        same_cluster(grant, response.cluster_id)
        return response.record

    # --- reads and operator calls ----------------------------------------------------------
    async def fenced_get(self, session_id: str, key: str) -> pb.FencedGetResponse:
        return await self._call(self.stub.FencedGet, pb.FencedGetRequest(session_id=session_id, key=key),
                                session_id)

    async def get_session(self, session_id: str) -> pb.GetSessionResponse:
        return await self._call(self.stub.GetSession, pb.GetSessionRequest(session_id=session_id), session_id)

    async def list_sessions(self) -> list[pb.SessionRecord]:
        found: list[pb.SessionRecord] = []
        token = ""
        while True:
            page = await self._call(self.stub.ListSessions, pb.ListSessionsRequest(page_size=500,
                                                                                   page_token=token))
            found.extend(page.records)
            token = page.next_page_token
            if not token:
                return found

    async def list_hosts(self) -> list[pb.HostRegistration]:
        return list((await self._call(self.stub.ListHosts, pb.ListHostsRequest())).hosts)

    async def probe(self, session_id: str) -> pb.ProbeSessionResponse:
        return await self._call(self.stub.ProbeSession, pb.ProbeSessionRequest(session_id=session_id),
                                session_id, timeout=30.0)

    async def recover(self, session_id: str, fence: int, reason: str, operator: str) -> pb.SessionRecord:
        request = pb.RecoverRequest(session_id=session_id, expected_fence=fence, reason=reason,
                                    operator=operator)
        return (await self._call(self.stub.Recover, request, session_id)).record

    async def watch(self, session_id: str, grant: Grant | None = None) -> AsyncIterator[pb.SessionRecord]:
        """The session's record now and at every change; reconnects while the coordinator is away.
        With `grant`, an event from another cluster than the grant's raises WRONG_CLUSTER."""
        backoff = 0.05
        while True:
            call = self.stub.WatchSessions(pb.WatchSessionsRequest(session_id=session_id))
            try:
                async for event in call:
                    backoff = 0.05
                    if grant is not None:
                        same_cluster(grant, event.cluster_id)
                    if not event.deleted:
                        yield event.record
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise _classify(exc, session_id, self.address) from None
            finally:
                call.cancel()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def next_change(self, session_id: str, timeout: float) -> None:
        """Returns at the record's first change after now, or after `timeout` seconds."""
        async def changed() -> None:
            first = True
            async for _record in self.watch(session_id):
                if not first:
                    return
                first = False  # the watch opens with the current record

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed(), max(timeout, 0.0))


def resolve_command(argv: list[str], cwd: str | None = None, path: str | None = None) -> str:
    """Where CMD's program is, as the gate's `exec` will find it (PATH lookup for a bare name,
    the executable bit for a path), or ClientError CMD_NOT_FOUND / CMD_NOT_EXECUTABLE. Checked
    before anything is asked of the coordinator: a typo must not cost a live owner its session
    (issue 17: `run --takeover -- <typo>` ended the owner, then failed to exec)."""
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


def takeover_operation(session_id: str, host_id: str) -> tuple[str, Path]:
    """The operation id of this host's takeover of the session, kept (mode 0600) until granted.

    The coordinator admits one handoff request per session, under its operation id; a takeover
    that gave up leaves its request standing, so the next try from this host must continue it
    under the same id rather than be refused as a conflicting operation.
    """
    state_home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    base = state_home / "holdfast" / "takeovers"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = base / f"{host_id}.{session_id}"
    with contextlib.suppress(OSError):
        kept = path.read_text().strip()
        if records.OPERATION_ID.fullmatch(kept):
            return kept, path
    operation_id = secrets.token_hex(16)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(operation_id)
    tmp.rename(path)
    return operation_id, path


def held_hint(spec: RunSpec) -> str:
    """HELD's next step after what this run already tried (issue 17: after a failed --takeover the
    hint suggested --takeover, after --wait ran out it suggested --wait)."""
    if spec.takeover and not spec.force:
        return (f"the owner did not let go within --handoff-timeout {spec.handoff_timeout:g}s; add `--force` "
                "to have its host's agent end its tree, or allow longer with --handoff-timeout")
    if spec.wait and not spec.takeover:
        return (f"still held after --wait {spec.wait:g}s; wait longer, or ask for it with `--takeover` "
                "(add `--force` to have its host's agent end the old tree)")
    return ""


async def obtain(client: Client, spec: RunSpec, operation_id: str,
                 say: Say = say_stderr) -> tuple[Grant, pb.SessionRecord]:
    """`_obtain`, with a refusal's next step fitted to this run: what it tried, the fence it met."""
    try:
        return await _obtain(client, spec, operation_id, say)
    except ClientError as err:
        if err.reason == "HELD":
            err.hint = held_hint(spec)
        elif err.reason in ("OWNERSHIP_UNKNOWN", "MANUAL_RECOVERY"):
            with contextlib.suppress(ClientError):  # best effort: the hint then says N
                err.fence = (await client.get_session(spec.session_id)).record.lease.fence
        raise


async def _obtain(client: Client, spec: RunSpec, operation_id: str,
                  say: Say = say_stderr) -> tuple[Grant, pb.SessionRecord]:
    """Acquire as the spec says: once; or waiting (`--wait`, the coordinator holds the call on the
    owner's exit); or as a takeover that asks the owner to let go, then — with force — has the
    owner's agent end it. Waiting between calls is on record changes, never on a polling timer."""
    loop = asyncio.get_running_loop()
    budget = spec.wait or (spec.handoff_timeout if spec.takeover else 0.0)
    deadline = loop.time() + budget
    if spec.takeover and await client.request_handoff(spec.session_id, operation_id) is not None:
        say(f"handoff of {spec.session_id} requested; waiting up to {budget:g}s for the owner to let go")
    while True:
        left = max(deadline - loop.time(), 0.0)
        try:
            return await client.acquire(spec.session_id, operation_id, provider=spec.provider,
                                        location=spec.location, wait_seconds=min(left, MAX_WAIT_S),
                                        takeover=spec.takeover)
        except ClientError as err:
            if not reasons.waitable(err.reason):
                raise
            left = deadline - loop.time()
            if left <= 0:
                if spec.force and err.reason != "RESERVED":
                    break
                raise
            # e.g. the owner's root exited but its tree is still ending: the next change decides.
            await client.next_change(spec.session_id, left)
    say(f"the owner of {spec.session_id} did not let go in {budget:g}s; asking its host's agent to end it")
    return await client.acquire(spec.session_id, operation_id, provider=spec.provider,
                                location=spec.location, takeover=True, force=True)


def cli_on_path(path: str) -> str:
    """`path` with this installation's `holdfast` reachable (issue 17: README's `holdfast put` failed
    inside `run` when the CLI was not on PATH, e.g. a venv not activated). Appended, never
    prepended: the child's own `python` and tools stay the ones it would have found."""
    here = os.path.dirname(sys.executable)
    if shutil.which("holdfast", path=path) or not os.access(os.path.join(here, "holdfast"), os.X_OK):
        return path
    return f"{path}{os.pathsep}{here}" if path else here


def child_environment(grant: Grant, grant_file: str, base: dict[str, str] | None = None,
                      tls_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PATH"] = cli_on_path(env.get("PATH", os.defpath))
    if tls_dir is not None:
        env[tls.TLS_DIR_ENV] = str(tls_dir)  # its `holdfast put` reaches the coordinator as `run` did
    env.update({
        grant.spawn_token_env: grant.spawn_token,
        "HOLDFAST_SESSION": grant.session_id,
        "HOLDFAST_FENCE": str(grant.fence),
        "HOLDFAST_COORDINATOR": grant.coordinator,
        "HOLDFAST_GRANT_FILE": grant_file,
    })
    return env


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
                 workdir: str, record: pb.SessionRecord, say: Say, terminal: int | None = None) -> None:
        self.client, self.spec, self.grant, self.gate, self.tree = client, spec, grant, gate, tree
        self.workdir, self.record, self.say, self.terminal = workdir, record, say, terminal
        self.ended_by = ""   # "", "handoff" or "lost"

    @classmethod
    async def start(cls, client: Client, spec: RunSpec, say: Say = say_stderr) -> Owner:
        resolve_command(spec.argv, spec.cwd)  # before Acquire or RequestHandoff, never after
        if spec.takeover:
            operation_id, kept = takeover_operation(spec.session_id, client.host_id)
            grant, _ = await obtain(client, spec, operation_id, say)
            kept.unlink(missing_ok=True)
        else:
            grant, _ = await obtain(client, spec, secrets.token_hex(16), say)
        workdir = tempfile.mkdtemp(prefix="holdfast-")  # mode 0700
        gate: Gate | None = None
        try:
            env = child_environment(grant, grant.write(workdir), tls_dir=client.tls_dir)
            gate = Gate(spec.argv, env, cwd=spec.cwd, process_group=0)
            # The commit has the host's agent attest the gate and move it, still blocked on its
            # pipe, into a session cgroup of the agent's making: every descendant is born in it.
            record = await client.commit(grant, gate.pid)
        except BaseException:
            if gate is not None:
                gate.abort()
                await asyncio.to_thread(gate.process.wait)
            with contextlib.suppress(ClientError):
                await client.release(grant)  # a reservation: lets the next caller in at once
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        tree = Tree.of_gate(grant.spawn_token_env, grant.spawn_token, gate.pid)  # before CMD can move
        terminal = hand_terminal(gate.pid)
        gate.release()
        owner = record.lease.owner
        say(f"session {grant.session_id} fence {grant.fence}: running on host {owner.host_id} "
            f"as pid {owner.pid}")
        if not owner.cgroup.path:
            say(f"no session cgroup on host {owner.host_id} ({owner.tree_proof_reason}): the tree's end "
                "is proven by its spawn token alone, and a process that drops it is not found")
        return cls(client, spec, grant, gate, tree, workdir, record, say, terminal)

    async def _watch(self) -> None:
        """Returns once the record asks this owner to end: a handoff request, or the fence lost."""
        try:
            async for record in self.client.watch(self.grant.session_id, self.grant):
                if self._ends(record.lease):
                    return
        except ClientError as err:
            if err.reason != "WRONG_CLUSTER":
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

    async def supervise(self, forward_signals: bool = True) -> int:
        """Until CMD's tree is gone and released; returns CMD's status as a shell reports it."""
        loop = asyncio.get_running_loop()
        if forward_signals:
            for sig in FORWARDED_SIGNALS:
                loop.add_signal_handler(sig, self._forward, sig)
        pidfd = os.pidfd_open(self.gate.pid)
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        watcher = asyncio.create_task(self._watch())
        try:
            await asyncio.wait({exited, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done():
                if watcher.exception() is not None:
                    self.say(f"stopped watching the record ({watcher.exception()}); CMD keeps running")
                elif self.ended_by:
                    await asyncio.to_thread(end_tree, self.tree, self.spec.grace)
            await exited
        finally:
            watcher.cancel()
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if forward_signals:
                for sig in FORWARDED_SIGNALS:
                    loop.remove_signal_handler(sig)
        status = status_of(self.gate.process.wait())
        try:
            await self.finish()
        finally:
            self.cleanup()
        return status

    async def finish(self) -> None:
        """End what is left of the tree, then Release; a fence already moved on needs no release."""
        if not await asyncio.to_thread(end_tree, self.tree, self.spec.grace):
            self.say("processes of the session's tree survived SIGKILL; not releasing")
            return
        try:
            await self.client.release(self.grant)
            self.say(f"session {self.grant.session_id} released at fence {self.grant.fence}")
        except ClientError as err:
            if err.reason != "STALE_FENCE":
                raise
            self.say(f"session {self.grant.session_id} has moved past fence {self.grant.fence}; "
                     "nothing to release")

    def cleanup(self) -> None:
        if self.terminal is not None:
            previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.terminal, os.getpgrp())
            signal.signal(signal.SIGTTOU, previous)
        shutil.rmtree(self.workdir, ignore_errors=True)


async def run(spec: RunSpec, address: str | None = None, host_id: str | None = None,
              say: Say = say_stderr) -> int:
    """`holdfast run`: CMD's status, or raises ClientError (nothing ran)."""
    async with Client(address, host_id) as client:
        owner = await Owner.start(client, spec, say)
        return await owner.supervise()
