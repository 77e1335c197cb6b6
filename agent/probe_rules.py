"""The probe verdict as a pure function: what was observed about a pid → one outcome, in exactly
the order of docs/design.md §2. Indeterminate is never death; the token is only positive evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.common.incarnation_rules import incarnation_verdict
from holdfast.v1 import agent_pb2

P = agent_pb2.ProbeOutcome
T = agent_pb2.TreeState
PROVEN_DEAD = (P.EXIT_OBSERVED, P.PID_ABSENT, P.IDENTITY_MISMATCH)


@dataclass(frozen=True)
class Observation:
    """What the agent saw of one pid; `error` set means it could not look (EPERM, EIO, parse)."""

    exit_watched: bool = False  # a pidfd held for this exact identity polled readable
    absent: bool = False  # no such pid, or /proc/<pid> gone and its pidfd reporting the exit
    error: str = ""
    state: str = ""
    start_ticks: int = 0
    pidfd_ino: int = 0  # 0: no pidfs inode could be taken
    pidfd_exited: bool = False  # the pidfd opened at this probe polled readable
    token_matched: bool | None = None  # None: no token recorded, or environ unreadable


def missing_from_proc(pid: int, exit_watched: bool, pidfd_exited: bool) -> Observation:
    """/proc/<pid> missing (ENOENT/ESRCH) after a pidfd for the pid was opened: absent only when that
    pidfd reports the exit. A /proc mounted hidepid=invisible or ptraceable shows a live process the
    reader may not ptrace-read in the very same way (proc/listing_rules.py)."""
    if pidfd_exited:
        return Observation(exit_watched=exit_watched, absent=True)
    return Observation(exit_watched=exit_watched, error=f"/proc hides a live pid: /proc/{pid} is missing "
                       "while its pidfd reports no exit (/proc mounted hidepid=invisible or ptraceable, "
                       "and this agent may not ptrace-read it)")


@dataclass(frozen=True)
class TreeObservation:
    enumerable: bool
    complete: bool  # stable, and no process that could be a member was unreadable
    unreadable: int
    carriers: int
    cgroup_populated: bool | None  # None: no cgroup recorded, or nothing known of it
    stable: bool = True  # the scan settled (every listed pid read) within its bound of passes
    passes: int = 1
    hidden: str = ""  # why the scan's listing may leave live processes out (not enumerable)


def token_decides(identity: agent_pb2.ProcessIdentity, pidfd_ino: int) -> bool:
    """Whether the token in the pid's environ can change `judge`'s outcome, the pidfs inode seen
    being `pidfd_ino` (0: none). Where both the recorded and the seen inode are known they decide
    first — differing: a mismatch; the same: the start ticks tell life from a contradiction — and the
    token would only add itself to `matched_on`. So that environ, another process's memory that it
    can make a read of wait forever (docs/guarantees.md), is read only when it can decide."""
    return bool(identity.spawn_token) and not (identity.pidfd_ino and pidfd_ino)


def _result(outcome: int, **kw: object) -> agent_pb2.ProbeResult:
    return agent_pb2.ProbeResult(outcome=outcome, **kw)  # type: ignore[arg-type]


def judge(
    identity: agent_pb2.ProcessIdentity,
    host_id: str,
    incarnation: agent_pb2.HostIncarnation,
    seen: Observation,
    variable: str,
) -> agent_pb2.ProbeResult:
    if identity.host_id != host_id:
        return _result(P.INDETERMINATE, reason=f"misrouted: owner is on host {identity.host_id!r}, "
                       f"this agent answers for {host_id!r}")
    if identity.spawn_token and identity.spawn_token_env != variable:
        # Scanning for another variable's name would find no carrier of a live tree and call it gone.
        recorded = identity.spawn_token_env or "an unnamed variable"
        return _result(P.INDETERMINATE, reason=f"the owner's token was attested in {recorded}, but this "
                       f"agent reads {variable}: restart it with the --spawn-token-env it had")
    verdict, why = incarnation_verdict(identity.incarnation, incarnation)
    if verdict == "ended":
        return _result(P.IDENTITY_MISMATCH, mismatch_field="incarnation", reason=why)
    if verdict == "unknown":
        return _result(P.INDETERMINATE, reason=why)
    if seen.exit_watched:
        return _result(P.EXIT_OBSERVED, reason="pidfd held for this identity reported its exit")
    if seen.absent:
        return _result(P.PID_ABSENT, reason=f"/proc/{identity.pid} does not exist")
    if seen.error:
        return _result(P.INDETERMINATE, reason=seen.error)
    matched: list[str] = []
    if identity.pidfd_ino and seen.pidfd_ino:
        if seen.pidfd_ino != identity.pidfd_ino:
            return _result(P.IDENTITY_MISMATCH, mismatch_field="pidfd",
                           reason="another process holds this pid (pidfs inode differs)")
        if identity.start_ticks and seen.start_ticks != identity.start_ticks:
            return _result(P.INDETERMINATE, contradiction=True,
                           reason="pidfs inode matches but start ticks differ: contradictory identity")
        matched.append("pidfd")
    if identity.start_ticks:
        if seen.start_ticks != identity.start_ticks:
            if seen.token_matched:
                return _result(P.INDETERMINATE, contradiction=True,
                               reason="spawn token matches but start ticks differ: contradictory identity")
            return _result(P.IDENTITY_MISMATCH, mismatch_field="start-time",
                           reason="another process holds this pid (start ticks differ)")
        matched.append("start-time")
    if matched and seen.state == "Z" and seen.pidfd_exited:
        # A zombie is dead only when its whole thread group is: a leader that called
        # pthread_exit shows Z while its other threads run, and then its pidfd is not readable.
        return _result(P.EXIT_OBSERVED, reason="zombie whose pidfd reports its exit")
    if seen.token_matched:
        matched.append("token")
    elif seen.token_matched is False and "pidfd" not in matched:
        # Start ticks alone cannot tell a pid reused inside the same tick from the owner whose
        # environ was rewritten: neither death nor life is proven.
        return _result(P.INDETERMINATE, reason="start ticks match but the process no longer carries the "
                       "token, and without a pidfs inode a pid reused in the same tick looks the same")
    if not matched:
        return _result(P.INDETERMINATE, reason="only the pid matched, which proves nothing")
    return _result(P.IDENTITY_MATCHED, matched_on=matched)


def tree_verdict(identity: agent_pb2.ProcessIdentity, tree: TreeObservation,
                 variable: str) -> tuple[agent_pb2.TreeState, str]:
    """(state, why), by the proof the agent chose at attestation (docs/design.md §2 *Which proof, when*):
    gone by an empty cgroup alone where the tree could not leave it; otherwise by an empty cgroup
    (where one was made) and a stable, complete scan that found no carrier of the token — read under
    the variable the token was attested in. ALIVE only on a member seen (a populated cgroup, a
    carrier); whatever could not be looked at is UNPROVEN, so that a scan that did not settle on a
    busy host is never reported as a live tree (its release then asked again, not given up)."""
    if identity.spawn_token and identity.spawn_token_env != variable:
        recorded = identity.spawn_token_env or "the unnamed"
        return T.TREE_UNPROVEN, (f"the scan reads {variable}, not {recorded} variable the token was "
                                 "attested in")
    proof = identity.tree_proof
    has_cgroup = bool(identity.cgroup.path)
    if has_cgroup:
        if tree.cgroup_populated is None:
            return T.TREE_UNPROVEN, "the session's cgroup could not be read"
        if tree.cgroup_populated:
            return T.TREE_ALIVE, "the session's cgroup is still populated"
    if tree.carriers:
        # Whatever the proof: a carrier the scan saw is alive, in the cgroup or not (a second root
        # started with the token beside the gate never entered the cgroup at all).
        return T.TREE_ALIVE, f"{tree.carriers} process(es) still carry the token"
    if has_cgroup and proof == agent_pb2.CGROUP_ONLY:
        return T.TREE_GONE, "the session's cgroup is empty, and the tree could not leave it"
    if not identity.spawn_token:
        return T.TREE_UNPROVEN, "identity records no spawn token; the tree cannot be checked"
    if not tree.enumerable:
        why = f": {tree.hidden}" if tree.hidden else ""
        return T.TREE_UNPROVEN, f"this host cannot enumerate processes{why}"
    if not tree.stable:
        return T.TREE_UNPROVEN, (f"the scan did not settle in {tree.passes} passes (processes kept exiting "
                                 "before they could be read); absence is unproven")
    if not tree.complete:
        return T.TREE_UNPROVEN, f"{tree.unreadable} process(es) could not be read; absence is unproven"
    return T.TREE_GONE, "no process carries the token" + (" and the cgroup is empty" if has_cgroup else "")
