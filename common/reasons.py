"""Every reason holdfast gives, declared once: what it is on the wire, to a shell and to a person.

Guarantee: a reason is one row of `TABLE` — its gRPC status code (None for a reason the client
gives itself, which never crosses the wire), the exit code `holdfast` maps it to, the next step it
names, whether `--wait` may wait it out (the answer can change by itself), and `holdfast probe`'s
verdict where a probe can answer it. The coordinator raises only reasons with a code, the client
maps exit codes and next steps from here, and docs/operations.md's refusal table is checked
against it by a test. Exit codes: 75 (EX_TEMPFAIL) when the session is held or its ownership
unknown, 69 (EX_UNAVAILABLE) when the coordinator or this host's registration is missing, 77
(EX_NOPERM) for certificates and roles, 2 for bad input, and the shell's 127/126 for a CMD `run`
cannot find or execute. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import grpc

DOMAIN = "holdfast.dev"
EX_FAILURE = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_NOPERM = 77
EX_NOEXEC = 126     # the shell's codes for a CMD that cannot be run: `run` never asked for anything
EX_NOTFOUND = 127
EX_INTERRUPTED = 128 + 2  # as a shell reports a command ended by SIGINT
EX_TERMINATED = 128 + 15  # and by SIGTERM
F = grpc.StatusCode.FAILED_PRECONDITION


class Reason(StrEnum):
    """Why a call was refused or failed: one row of TABLE each (compared as values, never spelled)."""

    # Verdicts that grant (adjudication's reasons for a grant; never an error).
    FREE = "FREE"
    OWNER_DEAD = "OWNER_DEAD"
    RESERVATION_SUPERSEDED = "RESERVATION_SUPERSEDED"
    # Refusals of the coordinator.
    STALE_FENCE = "STALE_FENCE"
    MANUAL_RECOVERY = "MANUAL_RECOVERY"
    OPERATION_CONFLICT = "OPERATION_CONFLICT"
    RESERVED = "RESERVED"
    HELD = "HELD"
    OWNERSHIP_UNKNOWN = "OWNERSHIP_UNKNOWN"
    NOT_LIVE = "NOT_LIVE"
    TREE_ALIVE = "TREE_ALIVE"
    ATTESTATION_FAILED = "ATTESTATION_FAILED"
    HOST_NOT_REGISTERED = "HOST_NOT_REGISTERED"
    HOST_LIVE = "HOST_LIVE"
    HOST_DRAINING = "HOST_DRAINING"
    HOST_FENCING = "HOST_FENCING"
    HOST_FENCED = "HOST_FENCED"
    RESTORE_PENDING = "RESTORE_PENDING"
    CHAIN_FULL = "CHAIN_FULL"
    RECORD_TOO_LARGE = "RECORD_TOO_LARGE"      # etcd refused the session's write by its size
    WRONG_CLUSTER = "WRONG_CLUSTER"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FORCE_NOT_ALLOWED = "FORCE_NOT_ALLOWED"
    WRONG_TENANT = "WRONG_TENANT"              # the session is another tenant's: nothing read for it
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    # The authorization gate's (common/authorization.py).
    UNAUTHENTICATED = "UNAUTHENTICATED"
    WRONG_ROLE = "WRONG_ROLE"
    # The client's own: decided before or without an answer of the coordinator.
    UNREACHABLE = "UNREACHABLE"                # no answer from the coordinator at all
    CMD_NOT_FOUND = "CMD_NOT_FOUND"            # checked before any call: nothing was asked
    CMD_NOT_EXECUTABLE = "CMD_NOT_EXECUTABLE"
    TLS_FILE_MISSING = "TLS_FILE_MISSING"      # a certificate or key --tls-dir should hold is not there
    TLS_HANDSHAKE_FAILED = "TLS_HANDSHAKE_FAILED"  # the coordinator's certificate and ours do not trust
    TLS_REQUIRED = "TLS_REQUIRED"              # a plaintext call to a coordinator that answered in TLS
    ENROLLMENT_REFUSED = "ENROLLMENT_REFUSED"  # the issuer refused this pod's token: no certificate
    ENROLLMENT_UNAVAILABLE = "ENROLLMENT_UNAVAILABLE"  # the issuer (or its API server) did not answer
    OWNER_ALIVE = "OWNER_ALIVE"                # `recover` refused by the CLI itself: the owner is alive
    GUARD_UNREACHABLE = "GUARD_UNREACHABLE"    # a --guard store failed before any call: nothing was asked
    GUARD_FAILED = "GUARD_FAILED"              # a store's marker could not take the grant's fence: released
    CARRY_FAILED = "CARRY_FAILED"              # carried state could not be packed or restored here
    GRANT_DIR_FAILED = "GRANT_DIR_FAILED"      # the grant file could not be made once granted: released
    INTERRUPTED = "INTERRUPTED"                # Ctrl-C (SIGINT) before the command finished
    TERMINATED = "TERMINATED"                  # `run` stopped (SIGTERM) before CMD ran
    # Carried state (`run --carry`), refused by the coordinator: nothing of the new copy is kept.
    CARRY_TOO_LARGE = "CARRY_TOO_LARGE"
    CARRY_BUDGET_EXHAUSTED = "CARRY_BUDGET_EXHAUSTED"
    CARRY_CORRUPT = "CARRY_CORRUPT"
    RELEASE_PENDING = "RELEASE_PENDING"  # asked for with await_release: the owner ended, not yet released
    TOO_MANY_CALLS = "TOO_MANY_CALLS"    # the caller or its tenant has its limit of long-lived calls open


class Family(StrEnum):
    """Which typed exception the client library raises for a reason (holdfast.client.errors), so a
    caller catches what it can act on — wait, take over, retry later, fix its input — by type."""

    NONE = ""                      # not a refusal a caller branches on: the plain ClientError
    HELD = "held"                  # a live owner (or one starting or ending) has the session
    UNKNOWN = "unknown-ownership"  # whether its owner lives is not proven either way
    STALE = "stale-fence"          # this grant no longer writes: the session moved on or let go
    PERMISSION = "permission"      # certificates, roles, tenants, secrets
    UNAVAILABLE = "unavailable"    # the coordinator, this host's agent or a store cannot serve now
    BAD_INPUT = "bad-input"        # the caller's own argument: fix it, retrying will not help


@dataclass(frozen=True)
class Meaning:
    code: grpc.StatusCode | None  # None: the client's own, never on the wire
    exit: int
    next_step: str                # may name {session} and {fence}
    waitable: bool = False        # the coordinator answered, and the answer can change by itself
    verdict: str = ""             # `holdfast probe`'s word for it, where a probe can answer it
    family: Family = Family.NONE  # the client library's exception type for it


TABLE: dict[Reason, Meaning] = {
    Reason.FREE: Meaning(None, 0, "", verdict="free"),
    Reason.OWNER_DEAD: Meaning(None, 0, "", verdict="grant"),
    Reason.RESERVATION_SUPERSEDED: Meaning(None, 0, "", verdict="grant"),
    Reason.HELD: Meaning(
        F, EX_TEMPFAIL,
        "wait for it with `--wait`, or ask for it with `--takeover` (add `--force` to have its host's "
        "agent end the old tree)",
        waitable=True, verdict="held", family=Family.HELD),
    Reason.RESERVED: Meaning(
        F, EX_TEMPFAIL,
        "another client is starting this session; retry after its commit deadline or use `--wait`",
        waitable=True, verdict="reserved", family=Family.HELD),
    Reason.OWNERSHIP_UNKNOWN: Meaning(
        F, EX_TEMPFAIL,
        "`holdfast probe {session}` shows why; only if you know the owner is gone: `holdfast recover "
        "{session} --fence {fence} --reason TEXT`",
        waitable=True, verdict="unknown", family=Family.UNKNOWN),
    Reason.MANUAL_RECOVERY: Meaning(
        F, EX_TEMPFAIL,
        "`holdfast show {session}`, then `holdfast recover {session} --fence {fence} --reason TEXT`",
        verdict="manual-recovery", family=Family.UNKNOWN),
    Reason.OPERATION_CONFLICT: Meaning(
        grpc.StatusCode.ABORTED, EX_TEMPFAIL,
        "another takeover is in progress; `holdfast show {session}` and retry once it has finished",
        verdict="held", family=Family.HELD),
    Reason.STALE_FENCE: Meaning(
        F, EX_TEMPFAIL,
        "the session has moved on; `holdfast show {session}` and retry",
        verdict="unknown", family=Family.STALE),
    Reason.TREE_ALIVE: Meaning(
        F, EX_TEMPFAIL,
        "processes of the session's tree are still running; end them, then `holdfast probe {session}`",
        waitable=True, verdict="held", family=Family.HELD),
    Reason.ATTESTATION_FAILED: Meaning(
        F, EX_TEMPFAIL,
        "this host's agent did not attest the spawn token (the message says whether it was unreachable or"
        " found no single carrier); check `holdfast hosts` lists this host, with a live agent, under the "
        "id `run` uses (--host-id / HOLDFAST_HOST_ID), then retry", family=Family.UNAVAILABLE),
    Reason.NOT_LIVE: Meaning(
        F, EX_TEMPFAIL,
        "fenced writes need the session's live owner; run them from inside `holdfast run`",
        family=Family.STALE),
    Reason.HOST_LIVE: Meaning(
        F, EX_TEMPFAIL,
        "another agent holds this host id; stop it or wait for its lease to expire"),
    Reason.HOST_DRAINING: Meaning(
        F, EX_TEMPFAIL,
        "this host is draining for maintenance; run on another host, or lift it with `holdfast drain HOST"
        " --undo`", family=Family.UNAVAILABLE),
    Reason.HOST_FENCING: Meaning(
        F, EX_TEMPFAIL,
        "this host is being fenced (its registration had lapsed); a power-off cannot be called back: the "
        "agent registers again once the attempt ends (`holdfast hosts` shows it)", family=Family.UNAVAILABLE),
    Reason.HOST_FENCED: Meaning(
        F, EX_TEMPFAIL,
        "this very host incarnation was proven off by its fencer and is running: the fence device lied or "
        "fenced another machine. Stop this host, check the fencer's options (plug, address) and "
        "`holdfast hosts`; a reboot registers as a new incarnation"),
    Reason.RESTORE_PENDING: Meaning(
        F, EX_TEMPFAIL,
        "etcd was restored from a backup: an operator must finish `holdfast admin restore-epoch` "
        "(docs/operations.md, Back up and restore etcd); retry after it reports grants reopened",
        family=Family.UNAVAILABLE),
    Reason.CHAIN_FULL: Meaning(
        F, EX_FAILURE,
        "the provider handle chain is full (its links or its bytes); start a new session id"),
    Reason.RECORD_TOO_LARGE: Meaning(
        F, EX_FAILURE,
        "the session's record is too large for one etcd request (a provider handle chain recorded "
        "before its byte cap); nothing was written: archive it (`holdfast admin archive {session} "
        "--fence {fence} --reason TEXT`; its record and history stay readable) and start again, or "
        "use a new session id"),
    Reason.HOST_NOT_REGISTERED: Meaning(
        F, EX_UNAVAILABLE,
        "start this host's agent with `--coordinator ADDR` (or `holdfast up`), or pass the registered id "
        "with --host-id", family=Family.UNAVAILABLE),
    Reason.WRONG_CLUSTER: Meaning(
        F, EX_UNAVAILABLE,
        "two holdfast clusters answer this coordinator address (e.g. two `holdfast up` on one port): stop"
        " the one that is not yours, and point --coordinator / HOLDFAST_COORDINATOR at the one that "
        "granted", family=Family.UNAVAILABLE),
    Reason.UNAVAILABLE: Meaning(
        grpc.StatusCode.UNAVAILABLE, EX_UNAVAILABLE,
        "the coordinator cannot reach etcd; check etcd, then retry", family=Family.UNAVAILABLE),
    Reason.PERMISSION_DENIED: Meaning(
        grpc.StatusCode.PERMISSION_DENIED, EX_NOPERM,
        "the grant secret does not match; use the grant file of the current owner (HOLDFAST_GRANT_FILE)",
        family=Family.PERMISSION),
    Reason.FORCE_NOT_ALLOWED: Meaning(
        grpc.StatusCode.PERMISSION_DENIED, EX_NOPERM,
        "force ends only an owner whose handoff this caller asked for: `holdfast run --takeover --force` "
        "(the same takeover), or an operator certificate; nothing was signalled", family=Family.PERMISSION),
    Reason.WRONG_TENANT: Meaning(
        grpc.StatusCode.PERMISSION_DENIED, EX_NOPERM,
        "the session id belongs to another tenant: pick another id, or use your own tenant's "
        "certificate (`holdfast certs issue --role client --tenant T`); nothing was asked or written",
        family=Family.PERMISSION),
    Reason.INVALID_ARGUMENT: Meaning(
        grpc.StatusCode.INVALID_ARGUMENT, EX_USAGE,
        "fix the argument; see `holdfast --help`", family=Family.BAD_INPUT),
    Reason.NOT_FOUND: Meaning(
        grpc.StatusCode.NOT_FOUND, EX_FAILURE,
        "no such session; `holdfast status` lists the sessions", family=Family.BAD_INPUT),
    Reason.UNAUTHENTICATED: Meaning(
        grpc.StatusCode.UNAUTHENTICATED, EX_NOPERM,
        "present a client certificate the coordinator trusts", family=Family.PERMISSION),
    Reason.WRONG_ROLE: Meaning(
        grpc.StatusCode.PERMISSION_DENIED, EX_NOPERM,
        "use the certificate of your role: client.pem for runtimes (`run`, `put`), operator.pem for "
        "`recover`, `drain` and `admin` (the CLI presents it from --tls-dir), maintenance.pem for "
        "purge-archives, agent-<host id>.pem for that host's agent (`holdfast certs init`, "
        "`--add-missing` for an older directory)", family=Family.PERMISSION),
    Reason.UNREACHABLE: Meaning(
        None, EX_UNAVAILABLE,
        "start one with `holdfast up`, or point --coordinator / HOLDFAST_COORDINATOR at a running "
        "coordinator", family=Family.UNAVAILABLE),
    Reason.CMD_NOT_FOUND: Meaning(
        None, EX_NOTFOUND,
        "check the command's spelling, or give its path; `run` looks it up on PATH as the shell does",
        family=Family.BAD_INPUT),
    Reason.CMD_NOT_EXECUTABLE: Meaning(
        None, EX_NOEXEC,
        "make it executable (`chmod +x`), or run it through its interpreter", family=Family.BAD_INPUT),
    Reason.TLS_FILE_MISSING: Meaning(
        None, EX_NOPERM,
        "make it with `holdfast certs init DIR` (`--add-missing` adds what an existing directory lacks), "
        "or point --tls-dir / HOLDFAST_TLS_DIR at the directory that has it", family=Family.PERMISSION),
    Reason.TLS_REQUIRED: Meaning(
        None, EX_NOPERM,
        "pass --tls-dir DIR (or set HOLDFAST_TLS_DIR) with certificates of the coordinator's CA (`holdfast "
        "certs init`; a `holdfast up --tls` keeps them in its state directory's tls/)",
        family=Family.PERMISSION),
    Reason.ENROLLMENT_REFUSED: Meaning(
        None, EX_NOPERM,
        "the enrollment issuer (HOLDFAST_ENROLL) refused this pod's token, for the reason in the message: "
        "HOLDFAST_TOKEN_FILE must be a projected ServiceAccount token of audience holdfast, the pod's "
        "namespace listed in the coordinator's session_namespaces, HOLDFAST_HOST_ID the pod's "
        "spec.nodeName (docs/tenants.md, Session pods)", family=Family.PERMISSION),
    Reason.ENROLLMENT_UNAVAILABLE: Meaning(
        None, EX_UNAVAILABLE,
        "the enrollment issuer at HOLDFAST_ENROLL (or the API server it asks) did not answer: check the "
        "address, the coordinator's --enroll-listen and its log, then retry", family=Family.UNAVAILABLE),
    Reason.TLS_HANDSHAKE_FAILED: Meaning(
        None, EX_NOPERM,
        "a certificate problem, not a missing coordinator: the coordinator's certificate is not from the "
        "CA in --tls-dir / HOLDFAST_TLS_DIR (or it serves plaintext: drop --tls-dir); check both sides' "
        "ca.pem", family=Family.PERMISSION),
    Reason.OWNER_ALIVE: Meaning(
        None, EX_TEMPFAIL,
        "end the owner first — `holdfast run --session {session} --takeover --force -- CMD` from another "
        "host has its agent end the tree — or stop it on its host; only if you mean to leave it running: "
        "add --yes", family=Family.HELD),
    Reason.GUARD_UNREACHABLE: Meaning(
        None, EX_UNAVAILABLE,
        "the guarded store named by --guard did not answer or refused; nothing was asked of the session's "
        "owner and nothing was written: fix the URL or start the store, then retry",
        family=Family.UNAVAILABLE),
    Reason.GUARD_FAILED: Meaning(
        None, EX_TEMPFAIL,
        "CMD did not run and the grant was released: a guarded store could not take fence {fence} (it "
        "is down, or has seen a newer fence — another holdfast cluster or a restored etcd); check it, "
        "then retry"),
    Reason.GRANT_DIR_FAILED: Meaning(
        None, EX_TEMPFAIL,
        "CMD did not run; the message says whether fence {fence} was released. The temp directory was "
        "checked before the grant, so it changed since: free space on its file system, remount it "
        "read-write, or set TMPDIR to a directory only you may write, then retry"),
    Reason.RELEASE_PENDING: Meaning(
        F, EX_TEMPFAIL,
        "the owner's CMD has ended and its `run` has not released yet (it may be uploading carried "
        "state); `run --carry` waits for that by itself — retry, or drop --carry to take the session now",
        waitable=True, family=Family.HELD),
    Reason.CARRY_FAILED: Meaning(
        None, EX_TEMPFAIL,
        "the carried state named by --carry could not be packed or restored (the message says which "
        "file and why); the session's last good copy is kept: fix the path, then retry"),
    Reason.INTERRUPTED: Meaning(
        None, EX_INTERRUPTED,
        "nothing it started is left behind: a grant it had was released (its tree ended first); run it "
        "again when you mean to"),
    Reason.TERMINATED: Meaning(
        None, EX_TERMINATED,
        "stopped before CMD ran (a service manager's or Kubernetes' stop): nothing it started is left "
        "behind, a grant it had was released; start it again when you mean to"),
    Reason.CARRY_TOO_LARGE: Meaning(
        F, EX_USAGE,
        "carry less (a smaller --carry PATH), raise the coordinator's carry_session_cap_bytes, or keep "
        "large state on a shared home or a blob store (docs/carry.md); the last good copy is kept",
        family=Family.BAD_INPUT),
    Reason.CARRY_BUDGET_EXHAUSTED: Meaning(
        grpc.StatusCode.RESOURCE_EXHAUSTED, EX_TEMPFAIL,
        "the carried state of the cluster (carry_budget_bytes) or of the session's tenant "
        "(carry_tenant_budget_bytes) is full — the message names which: archive finished sessions of "
        "that tenant or the cluster (`holdfast archive`), or raise that budget (the cluster's with "
        "etcd's quota); the last good copy is kept"),
    Reason.TOO_MANY_CALLS: Meaning(
        grpc.StatusCode.RESOURCE_EXHAUSTED, EX_TEMPFAIL,
        "end calls left open (a stalled `holdfast watch`, runs still waiting) or raise the setting the "
        "message names (calls_per_caller_max, calls_per_tenant_max); nothing was read or written",
        family=Family.UNAVAILABLE),
    Reason.CARRY_CORRUPT: Meaning(
        F, EX_TEMPFAIL,
        "the uploaded chunks do not match their manifest (a chunk lost or changed in flight); retry the "
        "upload — the last good copy is kept"),
}
UNKNOWN = Meaning(None, EX_FAILURE, "see the coordinator's log")  # a newer peer's reason, or none

# `holdfast probe`'s answer as its exit status, so a script can branch on it. 0 means "the next run
# would be granted"; 3 and 4 stay clear of the codes a refusal or a failure uses (1, 2, 69, 75, 77).
PROBE_FREE, PROBE_HELD, PROBE_UNKNOWN = 0, 3, 4
PROBE_EXIT = {"free": PROBE_FREE, "grant": PROBE_FREE, "held": PROBE_HELD, "reserved": PROBE_HELD,
              "unknown": PROBE_UNKNOWN, "manual-recovery": PROBE_UNKNOWN}


def meaning(reason: str) -> Meaning:
    try:
        return TABLE[Reason(reason)]
    except ValueError:
        return UNKNOWN


def exit_code(reason: str) -> int:
    return meaning(reason).exit


def next_step(reason: str, session: str = "SESSION", fence: int = 0) -> str:
    """`fence` is the session's current fence when the caller knows it (0: shown as N)."""
    step = meaning(reason).next_step or UNKNOWN.next_step
    return step.format(session=session or "SESSION", fence=fence or "N")


def family(reason: str) -> Family:
    return meaning(reason).family


def waitable(reason: str) -> bool:
    return meaning(reason).waitable


def verdict(reason: str) -> str:
    return meaning(reason).verdict


def probe_exit(verdict_name: str) -> int:
    """A verdict this CLI does not know yet (a newer coordinator's) is unknown, never free."""
    return PROBE_EXIT.get(verdict_name, PROBE_UNKNOWN)


def reason_of(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a call's failure, '' when it carries none."""
    # Imported here: only a failed call reads them, and `run` reaches CMD without one (~4 ms).
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


def parse(reason: str) -> Reason | str:
    """A reason read off the wire: one of ours, or as sent (a newer peer's, or a bare status code's
    name) — shown as it came, with the UNKNOWN meaning."""
    try:
        return Reason(reason)
    except ValueError:
        return reason


def wire_code(reason: Reason) -> grpc.StatusCode:
    """The status code a server refuses `reason` with; ValueError for a client's own reason."""
    code = TABLE[reason].code
    if code is None:
        raise ValueError(f"{reason} is a client's own reason, never a server's answer")
    return code


def status(code: grpc.StatusCode, reason: str, message: str) -> grpc.Status:
    """The one way a holdfast server refuses (coordinator, agent, enrollment, their role gates): the
    status code, the message and an ErrorInfo with the reason under DOMAIN, which `reason_of` reads."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=str(reason), domain=DOMAIN))
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[info]))
