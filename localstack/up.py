"""`holdfast up`: everything on one machine — an etcd of its own, a coordinator, and this host's
agent (or, with `--hosts N`, N simulated hosts) — and `holdfast exec --host N -- CMD`.

Guarantee: `up` reports ready only once etcd answers, the coordinator listens and every agent is
registered; Ctrl-C or SIGTERM stops agents, then the coordinator, then etcd, each by the pid it
started, so no record is lost; the state directory (etcd's data and its ports) makes a second `up`
on it find every record again. One `up` at a time per state directory: it holds an flock on
`STATE_DIR/up.lock` for its whole life, and a second `up` there refuses at once, naming the first's
pid, before it touches anything (the first's `up.json` stays); so does one refused for its arguments
(`--hosts` without root) or for want of etcd, before it makes, locks or removes anything. Everything
listens on 127.0.0.0/8 only.
A state directory another user could have written into is refused before anything is written: one
that is a link, not this user's or writable by others, that holds anything so (a link, a CA key of
theirs), or that lies under a directory they may change; nothing `up` writes there goes through a
link (open_state_dir).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from holdfast.common import certs, env, files, reasons, tls, upstate
from holdfast.common.upstate import DEFAULT_COORDINATOR
from holdfast.coordinator.store import Store, StoreUnavailable, etcd_credentials
from holdfast.localstack import etcd_server
from holdfast.localstack.etcd_server import EtcdServer, stop_process
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2, coordinator_pb2_grpc

LOCK_FILE = "up.lock"
PORTS_FILE = "etcd-ports.json"
DEFAULT_IP_BASE = 10          # simulated host N listens on 127.0.0.<base + N>
START_TIMEOUT_S = 20.0
# A registration this `up` cannot prove dead stays live until its etcd lease expires (TTL 10 s,
# renewed once when etcd restarts); the new agents register right after.
REGISTER_TIMEOUT_S = 40.0
SAY_WAITING_AFTER_S = 2.0  # when a registration is still awaited, say what for


def say(line: str) -> None:
    print(f"holdfast up: {line}", flush=True)


class UpError(Exception):
    """A reason `up` cannot start, with what to do about it."""


def open_state_dir(state_dir: Path) -> tuple[int, Path]:
    """The state directory, made if missing, open for the life of this `up`, and its path with no
    link in it: refused (UpError, nothing changed) when it, or anything in it, is a link or special
    file, not this user's, or writable by others, or when a directory above it is another user's
    or others may write it. Everything `up` and its children write goes to a path in it (etcd's
    data, certificates, logs, ready files), so a link another user planted there, or swapped in for
    it — or a file of theirs, a CA key to mint certificates from — would take root's writes
    anywhere, or its trust."""
    state_dir = Path(os.path.abspath(state_dir))
    try:
        fd = files.open_private_path(state_dir)
    except OSError as exc:
        raise UpError(_unsafe(exc, state_dir)) from None
    try:
        files.check_private_tree(fd, str(state_dir))
    except OSError as exc:
        os.close(fd)
        raise UpError(_unsafe(exc, state_dir)) from None
    # Its path through no link: no user but this one or root can change what it leads to.
    return fd, Path(os.readlink(f"/proc/self/fd/{fd}"))


def _unsafe(exc: OSError, state_dir: Path) -> str:
    where = exc.filename if os.path.isabs(str(exc.filename)) else state_dir
    uid = os.geteuid()
    must = (f"lie in directories only uid {uid} (or root) may change" if isinstance(exc, files.Swappable)
            else f"be uid {uid}'s alone, and all in it, with no links")
    return (f"{where}: {exc.strerror}; nothing was changed. A state directory must {must}. Next: pass "
            "another --state-dir (or, as its owner, remove or fix it)")


def lock_state_dir(directory: int, state_dir: Path) -> int:
    """Takes `up.lock` in the state directory open as `directory` for the life of this process and
    returns its fd (kept open; the kernel drops the lock when this process ends, however it ends, so
    a crash leaves no stale lock). The fd is close-on-exec: a child outliving `up` must not keep the
    directory locked."""
    try:
        fd = files.open_private_file(directory, LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UpError(_unsafe(exc, state_dir)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        who = f"pid {holder}" if holder.isdigit() else "another process"
        raise UpError(f"another `holdfast up` ({who}) is running with state in {state_dir}; nothing was "
                      f"changed. Next: use that one (`holdfast status`), stop it, or pass another "
                      f"--state-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def find_etcd() -> str:
    binary = os.environ.get("HOLDFAST_ETCD_BIN") or shutil.which("etcd")
    if not binary or not os.access(binary, os.X_OK):
        raise UpError("no etcd binary found. Next: install it with `apt-get install etcd-server` (or run "
                      "./scripts/setup), or set HOLDFAST_ETCD_BIN to an etcd >= 3.4")
    return binary


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: [0] the state, [19] the start ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2:].split()


def _start_ticks(pid: int) -> int:
    return int(_stat_fields(pid)[19])


def _same_process(pid: int, ticks: int) -> bool:
    """Whether `pid` still names the live process that had `ticks` (a zombie is dead: it runs
    nothing, only waits to be reaped); True when it cannot be read, so only a process proven gone
    has its registration released."""
    try:
        fields = _stat_fields(pid)
        return int(fields[19]) == ticks and fields[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        return True


def _left_registrations(state_dir: Path, directory: int) -> list[tuple[str, int, int, int]]:
    """(host id, lease, pid, start ticks) of each agent registration the up.json of an `up` that
    died names: the agent itself, or a simulated host's reaper (its namespace's PID 1, which takes
    the agent with it)."""
    try:
        state = upstate.load(state_dir, directory)
    except upstate.NoStack:
        return []
    left = []
    for host in state.get("hosts", []):
        try:
            pid = int(host.get("agent_pid") or host["reaper_pid"])
            ticks = int(host.get("agent_start_ticks") or host["reaper_start_ticks"])
            left.append((str(host["host_id"]), int(host["lease_id"]), pid, ticks))
        except (KeyError, TypeError, ValueError):
            continue  # written by an older `up`: its registrations lapse on their own
    return left


class Stack:
    """The processes of one `up`, started in order and stopped in reverse."""

    def __init__(self, state_dir: Path, listen: str, hosts: int, ip_base: int, use_tls: bool = False) -> None:
        self.state_dir = state_dir
        self.use_tls = use_tls
        self.listen = listen
        self.hosts_wanted = hosts
        self.ip_base = ip_base
        self.etcd: EtcdServer | None = None
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.agent: subprocess.Popen[bytes] | None = None
        self.agent_address = ""
        self.simhosts: list[SimulatedHost] = []
        self.tls_dir: Path | None = None
        self.dir_fd: int | None = None  # the state directory, checked ours alone once
        self.lock_fd: int | None = None
        self.leases: dict[str, int] = {}  # host id -> the etcd lease of its agent's registration

    # --- start -------------------------------------------------------------------------------
    def start(self, started: Callable[[], object] = lambda: None) -> None:
        """`started` runs once every process runs, before up.json says the stack is up (what a
        caller waiting on that file may act on at once)."""
        # Nothing this `up` or its children make is writable by group or others (umask 002 made
        # certificates 0664): the next `up` would refuse its own state directory.
        os.umask(os.umask(0o022) | 0o022)
        # Every check that needs nothing made first, before anything is: a refused `up` makes no
        # state directory, takes no lock and keeps a dead `up`'s up.json, which the next `up`
        # needs to release that one's leftover registrations.
        if self.hosts_wanted and os.geteuid() != 0:
            raise UpError("--hosts needs root: simulated hosts are PID namespaces. Next: run as root, "
                          "or without --hosts for this host's agent only")
        etcd_binary = find_etcd()
        if self.use_tls:
            try:
                certs.check_serve_on(self._serve_on())
            except certs.ReservedName as exc:
                raise UpError(f"--listen: {exc}. Next: listen on an address or another name") from None
        # Then, and outside the clean-up below: a refused second `up` must leave the running
        # one's up.json, etcd data and ports alone.
        self.dir_fd, self.state_dir = open_state_dir(self.state_dir)
        # With --tls every link is mTLS, with certificates kept in the state dir across restarts.
        self.tls_dir = self.state_dir / "tls" if self.use_tls else None
        try:
            self.lock_fd = lock_state_dir(self.dir_fd, self.state_dir)
        except UpError:
            os.close(self.dir_fd)
            self.dir_fd = None
            raise
        previous = _left_registrations(self.state_dir, self.dir_fd)  # an up.json left behind: that `up` died
        upstate.remove(self.dir_fd)
        try:
            self._make_certificates()
            self._start_etcd(etcd_binary)
            self._reclaim(previous)
            self._start_coordinator()
            self._start_agents()
            self._wait_registered()
            started()
            self._write_state()
        except BaseException:
            self.stop()
            raise

    def _host_ids(self) -> list[str]:
        return [f"host-{n}" for n in range(1, self.hosts_wanted + 1)] or [os.uname().nodename]

    def _serve_on(self) -> list[str]:
        """The names the coordinator's and etcd's certificates carry."""
        return sorted({"127.0.0.1", "localhost", self.listen.rsplit(":", 1)[0]})

    def _make_certificates(self) -> None:
        if self.tls_dir is None:
            return
        if (self.tls_dir / "ca.key").exists():  # e.g. more hosts than last time
            certs.ensure_issued(self.tls_dir, self._host_ids(), self._serve_on())
        else:
            certs.init_local(self.tls_dir, self._host_ids(), self._serve_on())

    def _tls_args(self) -> list[str]:
        return ["--tls-dir", str(self.tls_dir)] if self.tls_dir is not None else []

    def _coordinator_channel(self) -> grpc.Channel:
        return tls.open_channel(self.address, self.tls_dir, tls.Role("client"), sync=True)

    def _start_etcd(self, binary: str) -> None:
        # EtcdServer runs the module's binary; point it at the one found (HOLDFAST_ETCD_BIN / PATH).
        etcd_server.ETCD_BINARY = binary
        assert self.dir_fd is not None
        try:
            ports = upstate.read_json(self.dir_fd, PORTS_FILE)
        except FileNotFoundError:
            ports = {}
        # The same ports on every start: the member's peer URL is stored in its data directory.
        self.etcd = EtcdServer(self.state_dir / "etcd", client_port=ports.get("client", 0),
                               peer_port=ports.get("peer", 0),
                               tls_dir=self.tls_dir / tls.ETCD_SUBDIR if self.tls_dir else None)
        try:
            self.etcd.start(START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            raise UpError(f"etcd did not start: {exc}. Next: see {self.state_dir}/etcd/etcd.log") from None
        files.write_whole(self.dir_fd, PORTS_FILE,
                          json.dumps({"client": self.etcd.client_port, "peer": self.etcd.peer_port}).encode(),
                          mode=0o644)

    def _spawn(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
        assert self.dir_fd is not None
        ready = f"{name}.ready"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ready, dir_fd=self.dir_fd)
        log = files.open_private_file(self.dir_fd, f"{name}.log", files.APPEND, 0o644)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "holdfast.cli", *argv,
                                     "--ready-file", str(self.state_dir / ready)],
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        finally:
            os.close(log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not files.exists_at(self.dir_fd, ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                why, log = _last_line(self.state_dir / f"{name}.log"), self.state_dir / f"{name}.log"
                if "Next:" in why:  # its own next step, said once ("Next: … Next: …" before)
                    raise UpError(f"{name} did not start: {why} (its log: {log})")
                raise UpError(f"{name} did not start{': ' + why if why else ''}. Next: see {log}")
            time.sleep(0.02)
        return proc, upstate.read_json(self.dir_fd, ready)["address"]

    def _start_coordinator(self) -> None:
        assert self.etcd is not None
        self.coordinator, self.address = self._spawn(
            "coordinator", ["coordinator", "serve", "--etcd", self.etcd.url, "--listen", self.listen,
                            *self._tls_args()])

    def _start_agents(self) -> None:
        if not self.hosts_wanted:
            self.agent, self.agent_address = self._spawn(
                "agent", ["agent", "serve", "--listen", "127.0.0.1:0", "--host-id", os.uname().nodename,
                          "--coordinator", self.address, *self._tls_args()])
            return
        for n in range(1, self.hosts_wanted + 1):
            host = SimulatedHost(f"host-{n}", self.ip_base + n, self.state_dir / "hosts",
                                 agent_args=["--coordinator", self.address, *self._tls_args()])
            self.simhosts.append(host)
            host.start(START_TIMEOUT_S)

    def _reclaim(self, previous: list[tuple[str, int, int, int]]) -> None:
        """The registrations a dead `up` left, released where its agent is proven gone (the pid is
        absent, or another process's by its start ticks): revoking that registration's own lease
        touches no registration made since. Otherwise said, and left to lapse."""
        gone: list[int] = []
        for host_id, lease_id, pid, ticks in previous:
            if _same_process(pid, ticks):
                say(f"{host_id}: the agent of the `up` that left {upstate.STATE_FILE} (pid {pid}) still "
                    "runs; its registration holds the host id until its lease lapses")
            else:
                gone.append(lease_id)
        if gone:
            assert self.etcd is not None
            asyncio.run(_revoke(self.etcd.url, gone, self.etcd.tls_dir))
            say(f"released {len(gone)} registration(s) left by an `up` that died (its agents are gone)")

    def _wait_registered(self) -> None:
        wanted = {h.host_id: h.agent_address for h in self.simhosts}
        if self.agent is not None:
            wanted = {os.uname().nodename: self.agent_address}
        started = time.monotonic()
        deadline = started + REGISTER_TIMEOUT_S
        said = False
        with self._coordinator_channel() as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            while True:
                hosts = stub.ListHosts(coordinator_pb2.ListHostsRequest(), timeout=5).hosts
                ours = {i: h.lease_id for i, a in wanted.items()
                        for h in hosts if h.host_id == i and h.address == a}
                if len(ours) == len(wanted):
                    self.leases = ours
                    return
                if not said and time.monotonic() > started + SAY_WAITING_AFTER_S:
                    said = True
                    say(f"waiting for {', '.join(sorted(set(wanted) - set(ours)))} to register: a "
                        "registration left by an earlier agent of that host id holds it until its etcd "
                        f"lease lapses (up to {REGISTER_TIMEOUT_S:g} s)")
                if time.monotonic() > deadline:
                    raise UpError(f"agents not registered within {REGISTER_TIMEOUT_S:g}s. Next: see the "
                                  f"agent logs in {self.state_dir}")
                time.sleep(0.2)

    def _write_state(self) -> None:
        assert self.etcd is not None
        state = {
            "pid": os.getpid(),
            "coordinator": self.address,
            "etcd": self.etcd.url,
            "tls_dir": str(self.tls_dir) if self.tls_dir else "",
            "hosts": [
                {"n": n, "host_id": h.host_id, "ip": h.ip, "agent": h.agent_address,
                 "reaper_pid": h.reaper_pid, "reaper_start_ticks": _start_ticks(h.reaper_pid),
                 "lease_id": str(self.leases[h.host_id])}
                for n, h in enumerate(self.simhosts, start=1)
            ],
        }
        if self.agent is not None:
            # The agent's pid and start ticks: the next `up` releases its registration only once
            # this very process is gone.
            host_id = os.uname().nodename
            state["hosts"] = [{"n": 0, "host_id": host_id, "ip": "127.0.0.1", "agent": self.agent_address,
                               "agent_pid": self.agent.pid, "agent_start_ticks": _start_ticks(self.agent.pid),
                               "lease_id": str(self.leases[host_id])}]
        assert self.dir_fd is not None
        upstate.write(self.dir_fd, state)
        try:
            upstate.point(self.state_dir, self.address)
        except OSError as exc:
            raise UpError(f"cannot say in {upstate.default_state_dir()} which state directory serves "
                          f"{self.address}: {_unsafe(exc, upstate.default_state_dir())}") from None

    # --- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        if self.dir_fd is not None:
            upstate.remove(self.dir_fd)
        if self.address:
            upstate.unpoint(self.state_dir, self.address)
        # Recorded when the agents registered: known even when the coordinator died first.
        leases = list(self.leases.values())
        for host in reversed(self.simhosts):
            host.stop()
        self.simhosts = []
        if self.agent is not None:
            stop_process(self.agent)
            self.agent = None
        if leases and self.etcd is not None:
            # The agents behind these registrations were just stopped by this process, so the
            # registrations name nobody: dropping them lets the next `up` register at once instead
            # of waiting for their leases to run out. It removes routing only, never a record.
            asyncio.run(_revoke(self.etcd.url, leases, self.etcd.tls_dir))
        if self.coordinator is not None:
            stop_process(self.coordinator)
            self.coordinator = None
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None
        if self.lock_fd is not None:  # last: everything this `up` ran has stopped
            os.close(self.lock_fd)
            self.lock_fd = None
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None

    def failed(self) -> str:
        """The name of a part that died on its own, '' while all run."""
        if self.etcd is not None and self.etcd.process is not None and self.etcd.process.poll() is not None:
            return "etcd"
        for name, proc in (("coordinator", self.coordinator), ("agent", self.agent)):
            if proc is not None and proc.poll() is not None:
                return name
        return next((h.host_id for h in self.simhosts if not h.running), "")


async def _revoke(etcd_url: str, leases: list[int], etcd_tls_dir: Path | None) -> None:
    store = Store.connect(etcd_url, etcd_credentials(etcd_url, etcd_tls_dir))
    try:
        for lease in leases:
            with contextlib.suppress(StoreUnavailable, grpc.RpcError):  # gone already: fine
                await store.revoke_lease(lease)
    finally:
        await store.close()


def _last_line(log: Path) -> str:
    """The last line a child logged (its reason for stopping, e.g. a taken port), '' if none: of a
    JSON log line, its message."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    last = lines[-1].strip() if lines else ""
    with contextlib.suppress(ValueError, AttributeError):
        last = str(json.loads(last).get("msg", last))
    return last[:300]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


STOP_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)
# Signals of STOP_ON another thread took: the main thread blocks them to wait for them, and gRPC's
# threads do not, so one sent to the process may land on them; the main thread's handler notes it.
taken: list[int] = []


def _note(signum: int, frame: object) -> None:
    taken.append(signum)


def wait_for_stop(stack: Stack) -> int:
    """Until a stop signal (0) or a part of the stack exits on its own (1)."""
    while True:
        # A signal another thread took reaches its handler here only once this wait returns: the
        # timeout bounds how late it is seen, never whether.
        info = signal.sigtimedwait(STOP_ON, 1.0)
        signals = [info.si_signo] if info is not None else []
        signals += [taken.pop() for _ in range(len(taken))]
        if stops := [s for s in signals if s != signal.SIGCHLD]:
            say(f"{signal.Signals(stops[0]).name}: stopping")
            return 0
        if signals and (failed := stack.failed()):
            say(f"{failed} exited on its own; stopping everything. Next: see the logs in {stack.state_dir}")
            return 1


def block_stop_signals() -> None:
    """From up.json on, the stop signals are waited for: blocked after every child started (a
    blocked mask is inherited across exec and would deafen the children to SIGTERM) and before
    up.json is written, so a Ctrl-C sent as soon as it appears is a clean stop, not an interrupted
    start — on whichever thread it lands."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_ON)
    for signum in STOP_ON:
        signal.signal(signum, _note)


def _up(args: argparse.Namespace) -> int:
    stack = Stack(Path(args.state_dir), args.listen, args.hosts, args.ip_base, args.tls)
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM while starting stops what already runs
    try:
        stack.start(block_stop_signals)
    except UpError as exc:
        print(f"holdfast up: {exc}", file=sys.stderr)
        return reasons.EX_UNAVAILABLE
    except KeyboardInterrupt:
        return 130
    assert stack.etcd is not None
    say(f"etcd {stack.etcd.url} (data in {stack.state_dir / 'etcd'})")
    say(f"coordinator {stack.address}")
    if stack.address != DEFAULT_COORDINATOR:
        # The CLI's default is DEFAULT_COORDINATOR: anywhere else, say how to point it here.
        print(f"export {env.COORDINATOR}={stack.address}", flush=True)
    for n, host in enumerate(stack.simhosts, start=1):
        say(f"{host.host_id} agent {host.agent_address} (PID namespace; `holdfast exec --host {n} -- CMD`)")
    if stack.agent is not None:
        say(f"{os.uname().nodename} agent {stack.agent_address}")
    if stack.tls_dir is not None:
        say(f"mTLS on every link; certificates in {stack.tls_dir} (the CLI finds them for {stack.address} "
            f"through {stack.state_dir / upstate.STATE_FILE}, from any directory; elsewhere set "
            f"{env.TLS_DIR})")
    say(f"ready; state in {stack.state_dir}. Try `holdfast status`; Ctrl-C stops everything")
    code = wait_for_stop(stack)
    stack.stop()
    say("stopped")
    return code


def _exec(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        args.parser.error("exec needs a command after --")
    try:
        # Only a state directory of this user's: root enters the namespace of the pid it names.
        state = upstate.load_private(Path(args.state_dir))
    except upstate.NoStack as exc:
        print(f"holdfast exec: {exc}", file=sys.stderr)
        return reasons.EX_UNAVAILABLE
    host = next((h for h in state["hosts"] if h["n"] == args.host and "reaper_pid" in h), None)
    if host is None:
        n = len([h for h in state["hosts"] if "reaper_pid" in h])
        args.parser.error(f"no simulated host {args.host}: `holdfast up` runs {n} (hosts 1..{n})")
    try:
        alive = _start_ticks(host["reaper_pid"]) == host["reaper_start_ticks"]
    except (OSError, ValueError, IndexError):
        alive = False
    if not alive:
        print(f"holdfast exec: host {args.host} is not running. Next: restart `holdfast up`", file=sys.stderr)
        return reasons.EX_UNAVAILABLE
    environ = {**os.environ, env.HOST_ID: host["host_id"], env.COORDINATOR: state["coordinator"]}
    if state.get("tls_dir"):
        environ[env.TLS_DIR] = state["tls_dir"]
    # --wdns: the caller's directory, as a local command would have (in `/`, CMD's relative paths
    # would fail). The host's mount namespace sees the same files. Written with `=`:
    # util-linux 2.38 takes a separate word after --wdns for the command.
    argv = ["nsenter", "--target", str(host["reaper_pid"]), "--pid", "--mount", f"--wdns={os.getcwd()}",
            "--", *cmd]
    os.execvpe("nsenter", argv, environ)
    return 0  # not reached: exec replaced this process


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("up", help="etcd, a coordinator and agents on this machine",
                              description="Start etcd, a coordinator and this host's agent (or N "
                              "simulated hosts) on 127.0.0.0/8, and keep them until Ctrl-C. One `up` "
                              "per state directory; a second one there refuses, naming the first's pid. "
                              "Exit 0 after Ctrl-C, 69 when a part cannot start.")
    p.add_argument("--state-dir", default=str(upstate.default_state_dir()),
                   help="etcd data, ports and up.json (default: $HOLDFAST_STATE_DIR, else "
                   "$XDG_STATE_HOME/holdfast, by default ~/.local/state/holdfast: here %(default)s)")
    p.add_argument("--listen", default=DEFAULT_COORDINATOR,
                   help=f"coordinator address (default {DEFAULT_COORDINATOR})")
    p.add_argument("--hosts", type=int, default=0, choices=range(0, 41), metavar="N",
                   help="N simulated hosts (PID namespaces, root) instead of this host's agent")
    p.add_argument("--ip-base", type=int, default=DEFAULT_IP_BASE, choices=range(1, 200), metavar="B",
                   help=f"simulated host N listens on 127.0.0.<B+N> (default {DEFAULT_IP_BASE})")
    p.add_argument("--tls", action="store_true",
                   help="mTLS on every link: certificates made once in STATE_DIR/tls (`holdfast certs init`)")
    p.set_defaults(handler=_up)

    p = subparsers.add_parser("exec", help="run CMD on a simulated host of `holdfast up --hosts N`",
                              usage="holdfast exec --host N -- CMD [ARGS...]")
    p.add_argument("--host", type=int, required=True, metavar="N",
                   help="which simulated host: 1..N of `holdfast up --hosts N`")
    p.add_argument("--state-dir", default=str(upstate.default_state_dir()),
                   help="the state directory of that `up` (default as `up`'s: here %(default)s)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_exec, parser=p)
