"""`holdfast agent doctor`: can this agent prove life and death on this host? One line per check.

Guarantee: every check is a pure function of `Facts` gathered once at the edge (`gather`), and each
failing line names its fix; the command exits 0 only when no check fails. A check that cannot be
run here (no coordinator configured, not asked to check a node) is `skip`, never `pass`. A check
whose fact leaves every proof sound but some weaker (more trees need a complete scan) is `warn`
with its fix: the agent is still Ready, as every answer it gives is true.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from holdfast.agent import hostinfo, hostinfo_rules
from holdfast.agent.reads import Readers
from holdfast.common import reloading, timens, tls
from holdfast.common.incarnation_rules import machine_id_problem
from holdfast.common.timens_rules import time_namespace_problem
from holdfast.common.version import JSON_SCHEMA
from holdfast.proc import cgroups, listing_rules
from holdfast.proc.environ import EnvironReader
from holdfast.proc.procstat import StatParseError, parse_stat
from holdfast.proc.scan import listing_hidden
from holdfast.v1 import coordinator_pb2, coordinator_pb2_grpc

INIT_PID_NS = 4026531836  # PROC_PID_INIT_INO: the inode of every init PID namespace
CAP_SYS_PTRACE = 19
HEALTH_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Unreadable:
    """A process whose environ this agent could not read, as the doctor names it."""

    pid: int
    comm: str
    uid: int
    start_ticks: int | None  # None when its stat was unreadable too
    error: str  # e.g. "Permission denied"
    hz: int = 100  # clock ticks per second, to say when it started

    @property
    def namespace_init(self) -> bool:
        """PID 1 of the namespace the agent judges: started before every process in it, and never a
        descendant of a gate, so never a member of a session tree. The stable scan does not count
        an unreadable process older than a tree's root (proc/scan.py), so it never counts this one."""
        return self.pid == 1

    def describe(self) -> str:
        started = "start unknown" if self.start_ticks is None else \
            f"started {self.start_ticks / self.hz:.2f}s after boot"
        return f"pid {self.pid} ({self.comm or '?'}, uid {self.uid}, {started}; {self.error})"


@dataclass(frozen=True)
class Facts:
    node: bool  # configured for a node: the init PID namespace is required
    pid_ns: int
    cap_eff: int
    environ_read: int  # processes whose environ was read
    environ_denied: int  # processes whose environ read failed (the scan would be incomplete)
    environ_other_users: int  # of those read or denied, how many belong to another uid
    environ_error: str  # the first failure, e.g. "pid 1: Permission denied"
    pidfs: bool
    cgroup_root: str
    cgroup_problem: str  # why session cgroups cannot be made here; "" when they can
    boot_id: str  # "" when unreadable
    machine_id: str  # "" when unreadable
    coordinator: str
    coordinator_error: str  # "" when it answered SERVING
    unreadable: tuple[Unreadable, ...] = ()  # the denied processes themselves (environ_denied of them)
    cert_seconds_left: float | None = None  # this agent's certificate (with tls_dir); None: not checked
    cert_error: str = ""  # why it could not be read
    fenced: str | None = None  # the fence that proved this very incarnation off; "" none; None: not asked
    ptrace_scope: int | None = None  # kernel.yama.ptrace_scope; None: no Yama, or unreadable
    proc_hidden: str = ""  # why the agent's /proc listing may leave processes out; "" none
    time_ns: int | None = None  # /proc/self/ns/time's inode; None: no time namespaces in this kernel
    timens_offsets: str | None = None  # /proc/self/timens_offsets; None: absent


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str
    fix: str = ""


def _result(name: str, ok: bool, detail: str, fix: str) -> Check:
    return Check(name, "pass", detail) if ok else Check(name, "fail", detail, fix)


# --- pure checks ----------------------------------------------------------------------------------
def check_pid_ns(f: Facts) -> Check:
    if not f.node:
        return Check("init-pid-namespace", "skip", f"pid namespace {f.pid_ns}; pass --node to require the "
                     "node's own")
    return _result("init-pid-namespace", f.pid_ns == INIT_PID_NS,
                   f"pid namespace {f.pid_ns} (the init namespace is {INIT_PID_NS})",
                   "run the agent with hostPID: true (a pod's own PID namespace hides the node's processes)")


def check_ptrace(f: Facts) -> Check:
    return _result("cap-sys-ptrace", bool(f.cap_eff >> CAP_SYS_PTRACE & 1), f"CapEff {f.cap_eff:#x}",
                   "add capability SYS_PTRACE to the agent container (securityContext.capabilities.add)")


MAX_NAMED = 3  # unreadable processes named in a check's detail


def check_environ(f: Facts) -> Check:
    """Every environ readable: pass. Only the namespace's PID 1 unreadable (a container runtime's or
    sandbox's init is, even to root): pass, naming it and why it does not matter. Anything else
    unreadable would leave a scan incomplete: fail with the ptrace fix. A sandbox's own PID 1 alone
    must not fail root's check with a CAP_SYS_PTRACE/AppArmor hint that does not apply."""
    counts = f"{f.environ_read} read, {f.environ_denied} denied, {f.environ_other_users} of other users"
    if f.environ_denied == 0:
        return Check("environ-readable", "pass", counts)
    harmless = [u for u in f.unreadable if u.namespace_init]
    if f.unreadable and len(harmless) == f.environ_denied:
        return Check("environ-readable", "pass", f"{counts}; unreadable: {harmless[0].describe()}: it is "
                     "this PID namespace's init, older than every tree root and never a member of a tree, "
                     "so no scan counts it (no fix needed)")
    others = [u for u in f.unreadable if not u.namespace_init]
    named = "; ".join(u.describe() for u in others[:MAX_NAMED]) or f.environ_error
    more = f" and {len(others) - MAX_NAMED} more" if len(others) > MAX_NAMED else ""
    detail = f"{counts} (unreadable: {named}{more})" if named else counts
    return Check("environ-readable", "fail", detail,
                 "scans stay incomplete until every environ is readable: CAP_SYS_PTRACE, and an AppArmor "
                 "profile that allows ptrace reads (appArmorProfile: Unconfined)")


def check_proc_listing(f: Facts) -> Check:
    """A /proc that hides processes from the agent (hidepid=invisible/ptraceable, subset=pid) leaves
    every scan incomplete: no tree proven gone by one, not even the processes environ-readable counts
    (a hidden one is not seen to be unreadable). A failure, as check_environ's: on such a host every
    session whose tree's end needs a scan (any without a session cgroup that holds its tree) is
    stuck at TREE_UNPROVEN, its release and takeover waiting on the operator."""
    return _result("proc-listing", not f.proc_hidden, f.proc_hidden or "/proc lists every process to this "
                   "agent", listing_rules.FIX)


def check_pidfs(f: Facts) -> Check:
    return _result("pidfs", f.pidfs, "pidfd inodes are per process" if f.pidfs else "no pidfs",
                   "use Linux >= 6.9: without pidfs a pid reused within one clock tick is told apart only "
                   "by its spawn token")


def check_cgroup(f: Facts) -> Check:
    ok = not f.cgroup_problem
    detail = f"session cgroups under {f.cgroup_root}, in the node's cgroup namespace" if ok \
        else f.cgroup_problem
    return _result("cgroup-v2", ok, detail, "mount the node's /sys/fs/cgroup (cgroup v2, unified) read-write "
                   "and run the agent in the node's cgroup namespace (/proc/self/cgroup and /proc/1/cgroup "
                   "must read 0::/...): without a session cgroup a tree's end rests on the scan alone")


def check_ptrace_scope(f: Facts) -> Check:
    """Without Yama at 1 or more, a process of a tree may ptrace any process of its uid: take what it
    holds open (a cgroup.procs file to leave by), so no empty cgroup alone proves a tree gone and each
    end needs a complete scan too; or make it write, outside the tree (docs/guarantees.md). A warning,
    not a failure: the tree's own proof stays sound, and a tree's user can start a writer outside
    holdfast anyway; failing would keep every agent on a Yama-less node (Debian's default) unready."""
    if f.ptrace_scope is not None and f.ptrace_scope >= 1:
        return Check("ptrace-scope", "pass", f"kernel.yama.ptrace_scope is {f.ptrace_scope}: an empty "
                     "session cgroup alone proves a confined tree gone")
    scope = "absent (no Yama)" if f.ptrace_scope is None else f"{f.ptrace_scope}"
    return Check("ptrace-scope", "warn", f"kernel.yama.ptrace_scope is {scope}: every tree's end needs its "
                 "empty cgroup and a complete scan, and a tree may ptrace any process of its user into "
                 "writing outside it", "set kernel.yama.ptrace_scope=1 (a file in "
                 "/etc/sysctl.d/, then `sysctl --system`; a kernel without /proc/sys/kernel/yama needs "
                 "CONFIG_SECURITY_YAMA)")


def check_boot_id(f: Facts) -> Check:
    """A machine id that names no one machine fails too: the agent refuses to start with it."""
    bad = machine_id_problem(f.machine_id)
    detail = f"boot id {f.boot_id or 'unreadable'}, machine id {f.machine_id or 'unreadable'}" + \
        (f" ({bad})" if bad else "")
    return _result("boot-id", bool(f.boot_id) and not bad, detail, "/proc/sys/kernel/random/boot_id must "
                   f"be readable, and /etc/machine-id name this machine: {hostinfo_rules.MACHINE_ID_FIX}")


def check_time_ns(f: Facts) -> Check:
    """Start times read under a time namespace's offsets are not the ones every other agent reads:
    the agent refuses to start there (agent/hostinfo_rules.py)."""
    bad = time_namespace_problem(f.time_ns, f.timens_offsets)
    detail = "no time namespaces in this kernel" if f.time_ns is None and f.timens_offsets is None \
        else f"the initial time namespace ({f.time_ns}), no offsets"
    return _result("time-namespace", not bad, bad or detail, hostinfo_rules.TIME_NS_FIX)


def check_coordinator(f: Facts) -> Check:
    if not f.coordinator:
        return Check("coordinator", "skip", "none configured (--coordinator / HOLDFAST_COORDINATOR)")
    return _result("coordinator", not f.coordinator_error,
                   f"{f.coordinator}: " + (f.coordinator_error or "SERVING"),
                   "check the address, the coordinator pods and that the NetworkPolicy lets this node reach "
                   "the coordinator Service")


# Below this an enrolled agent has missed several renewals (it renews with 8 h of a day's lifetime
# left); the same threshold as the HoldfastCertificateExpiring alert.
CERT_WARN_SECONDS = 6 * 3600


def check_fenced(f: Facts) -> Check:
    """This host's running incarnation is the one a fencer proved off: its sessions were freed on
    the device's word, so whatever it runs may be a second writer (the coordinator refuses its
    registration, HOST_FENCED)."""
    if f.fenced is None:
        return Check("fenced", "skip", "not asked (no coordinator configured, or it did not answer)")
    return _result("fenced", not f.fenced, f.fenced or "this incarnation was not fenced",
                   "this machine was reported powered off and is running: stop it now, then fix its "
                   "fencer's options (plug, address) in the coordinator's settings")


def check_certificate(f: Facts) -> Check:
    if f.cert_seconds_left is None and not f.cert_error:
        return Check("certificate", "skip", "no TLS configured (--tls-dir / HOLDFAST_TLS_DIR)")
    if f.cert_error:
        return _result("certificate", False, f.cert_error, "enroll with `holdfast agent serve --enroll`, "
                       "or issue one with `holdfast certs issue --role agent --host HOST_ID`")
    left = f.cert_seconds_left or 0.0
    detail = f"expires in {left / 3600:.1f} h" if left > 0 else f"expired {-left / 3600:.1f} h ago"
    return _result("certificate", left > CERT_WARN_SECONDS, detail,
                   "renewal is failing: check the agent's log (`certificate renewal failed`) and the "
                   "issuer's (`enrollment refused`)")


CHECKS: tuple[Callable[[Facts], Check], ...] = (
    check_pid_ns, check_ptrace, check_proc_listing, check_environ, check_pidfs, check_cgroup,
    check_ptrace_scope, check_boot_id,
    check_time_ns, check_coordinator, check_certificate, check_fenced)


def run_checks(f: Facts) -> list[Check]:
    return [check(f) for check in CHECKS]


def healthy(checks: list[Check]) -> bool:
    return all(c.status != "fail" for c in checks)


def render_text(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.status:4}  {c.name}: {c.detail}" + (f"\n      fix: {c.fix}" if c.fix else ""))
    return "\n".join(lines)


def as_json(checks: list[Check]) -> dict[str, object]:
    return {"schema": JSON_SCHEMA, "ok": healthy(checks), "checks": [asdict(c) for c in checks]}


# --- the edge: facts from this process and host ---------------------------------------------------
def cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _uid(pid: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _comm_and_start(pid: str) -> tuple[str, int | None]:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    try:
        return comm, parse_stat(Path(f"/proc/{pid}/stat").read_bytes()).start_ticks
    except (OSError, StatParseError):
        return comm, None


def environ_facts(environ: EnvironReader) -> tuple[int, int, int, str, tuple[Unreadable, ...]]:
    """Reads every visible process's environ as a scan would, through `environ`: (read, denied,
    other users, first error, the denied processes)."""
    me, self_pid = os.geteuid(), str(os.getpid())
    read = denied = others = 0
    first = ""
    hz = os.sysconf("SC_CLK_TCK")
    unreadable: list[Unreadable] = []
    for entry in os.listdir("/proc"):
        uid = _uid(entry) if entry.isdigit() and entry != self_pid else None
        if uid is None:
            continue
        try:
            block = environ(entry, None, "/proc")
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError as exc:
            denied += 1
            others += uid != me
            first = first or f"pid {entry} (uid {uid}): {exc.strerror}"
            comm, start = _comm_and_start(entry)
            unreadable.append(Unreadable(int(entry), comm, uid, start, exc.strerror or str(exc), hz))
            continue
        if block is not None:  # None: kernel thread or zombie, nothing to read
            read += 1
            others += uid != me
    return read, denied, others, first, tuple(sorted(unreadable, key=lambda u: u.pid))


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def coordinator_error(address: str, tls_dir: Path | None, host_id: str) -> str:
    """Asks gRPC health the way the agent registers: over mTLS as agent-<host id> when configured."""
    try:
        with tls.open_channel(address, tls_dir, tls.Role("agent", host_id), sync=True) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                              timeout=HEALTH_TIMEOUT_S)
    except grpc.RpcError as exc:
        return f"unreachable ({exc.code().name})"  # type: ignore[attr-defined]
    except OSError as exc:  # the certificate files
        return f"cannot read the agent certificate: {exc}"
    return "" if reply.status == health_pb2.HealthCheckResponse.SERVING else \
        health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def fenced_here(address: str, tls_dir: Path | None, host_id: str) -> str | None:
    """The coordinator's word on whether this very incarnation was fenced: the proof's detail, ""
    when not, None when it could not be asked."""
    try:
        with tls.open_channel(address, tls_dir, tls.Role("agent", host_id), sync=True) as channel:
            listing = coordinator_pb2_grpc.CoordinatorStub(channel).ListHosts(
                coordinator_pb2.ListHostsRequest(), timeout=HEALTH_TIMEOUT_S)
    except (grpc.RpcError, OSError):
        return None
    mine = hostinfo.current_incarnation()
    for state in listing.fence_states:
        if state.host_id == host_id and state.state == "fenced" and state.attempt.incarnation == mine:
            attempt = state.attempt
            return (f"this incarnation was proven off by {attempt.program} from {attempt.coordinator} "
                    f"({attempt.detail})")
    return ""


def in_init_pid_ns() -> bool:
    return os.stat("/proc/self/ns/pid").st_ino == INIT_PID_NS


def gather(node: bool, coordinator: str, tls_dir: Path | None = None, host_id: str = "",
           cgroup_ns_error: str = "") -> Facts:
    # Guarded as the agent's own reads (agent/reads.py): a process whose environ read waits forever
    # is named unreadable after 0.5 s, and the doctor still answers.
    readers = Readers()
    read, denied, others, first, unreadable = asyncio.run(readers.run(environ_facts, readers.environ))
    able = cgroups.capability()
    time_ns, offsets = timens.time_namespace()
    return Facts(
        node=node, pid_ns=os.stat("/proc/self/ns/pid").st_ino, cap_eff=cap_eff(),
        environ_read=read, environ_denied=denied, environ_other_users=others, environ_error=first,
        pidfs=hostinfo.has_pidfs(), cgroup_root=able.root,
        cgroup_problem=f"cannot join the node's cgroup namespace: {cgroup_ns_error}" if cgroup_ns_error
        else able.reason,
        boot_id=_read("/proc/sys/kernel/random/boot_id"), machine_id=hostinfo.machine_id(),
        coordinator=coordinator,
        coordinator_error=coordinator_error(coordinator, tls_dir, host_id) if coordinator else "",
        unreadable=unreadable,
        fenced=fenced_here(coordinator, tls_dir, host_id) if coordinator and host_id else None,
        ptrace_scope=cgroups.ptrace_scope(),
        proc_hidden=listing_hidden("/proc"),
        time_ns=time_ns, timens_offsets=offsets,
        **certificate_facts(tls_dir, host_id),
    )


def certificate_facts(tls_dir: Path | None, host_id: str) -> dict[str, object]:
    if tls_dir is None or not host_id:
        return {}
    try:
        return {"cert_seconds_left": reloading.seconds_left(tls_dir, tls.Role("agent", host_id))}
    except (OSError, ValueError) as exc:
        return {"cert_error": f"cannot read agent-{host_id}.pem: {exc}"}
