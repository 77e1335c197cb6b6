"""What a refusal means to a person and to a shell (DESIGN.md §6): an exit code and a next step.

Guarantee: every coordinator reason maps to exactly one exit code — 75 (EX_TEMPFAIL) when the
session is held or its ownership unknown, 69 (EX_UNAVAILABLE) when the coordinator or this host's
agent registration is missing, 77 (EX_NOPERM) for authentication, 2 for bad input, and the
shell's 127/126 for a CMD `run` cannot find or execute — and every message names what to do next.
Pure: no I/O.
"""

from __future__ import annotations

EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_NOPERM = 77
EX_FAILURE = 1
EX_NOEXEC = 126     # the shell's codes for a CMD that cannot be run: `run` never asked for anything
EX_NOTFOUND = 127

UNREACHABLE = "UNREACHABLE"  # the client's own reason: no answer from the coordinator at all
# The client's own reasons for a CMD it will not try: checked before any call, so nothing was asked.
CMD_NOT_FOUND = "CMD_NOT_FOUND"
CMD_NOT_EXECUTABLE = "CMD_NOT_EXECUTABLE"
TLS_FILE_MISSING = "TLS_FILE_MISSING"  # a certificate or key --tls-dir should hold is not there
TLS_HANDSHAKE_FAILED = "TLS_HANDSHAKE_FAILED"  # the coordinator's certificate and ours do not trust
OWNER_ALIVE = "OWNER_ALIVE"  # `recover` refused by the CLI itself: the owner is proven alive

_TABLE: dict[str, tuple[int, str]] = {
    "HELD": (EX_TEMPFAIL, "wait for it with `--wait`, or ask for it with `--takeover` "
                          "(add `--force` to have its host's agent end the old tree)"),
    "RESERVED": (EX_TEMPFAIL, "another client is starting this session; retry after its commit deadline "
                              "or use `--wait`"),
    "OWNERSHIP_UNKNOWN": (EX_TEMPFAIL, "`holdfast probe {session}` shows why; only if you know the owner "
                                       "is gone: `holdfast recover {session} --fence {fence} --reason TEXT`"),
    "MANUAL_RECOVERY": (EX_TEMPFAIL, "`holdfast show {session}`, then `holdfast recover {session} "
                                     "--fence {fence} --reason TEXT`"),
    "OPERATION_CONFLICT": (EX_TEMPFAIL, "another takeover is in progress; `holdfast show {session}` and "
                                        "retry once it has finished"),
    "STALE_FENCE": (EX_TEMPFAIL, "the session has moved on; `holdfast show {session}` and retry"),
    "TREE_ALIVE": (EX_TEMPFAIL, "processes of the session's tree are still running; end them, then "
                                "`holdfast probe {session}`"),
    "ATTESTATION_FAILED": (EX_TEMPFAIL, "this host's agent did not attest the spawn token (the message says "
                                        "whether it was unreachable or found no single carrier); check "
                                        "`holdfast hosts` lists this host, with a live agent, under the id "
                                        "`run` uses (--host-id / HOLDFAST_HOST_ID), then retry"),
    "NOT_LIVE": (EX_TEMPFAIL, "fenced writes need the session's live owner; run them from inside "
                              "`holdfast run`"),
    "HOST_LIVE": (EX_TEMPFAIL, "another agent holds this host id; stop it or wait for its lease to expire"),
    "HOST_DRAINING": (EX_TEMPFAIL, "this host is draining for maintenance; run on another host, or lift "
                                   "it with `holdfast drain HOST --undo`"),
    "RESTORE_PENDING": (EX_TEMPFAIL, "etcd was restored from a backup: an operator must finish "
                                     "`holdfast admin restore-epoch` (docs/operations.md, Back up and "
                                     "restore etcd); retry after it reports grants reopened"),
    "CHAIN_FULL": (EX_FAILURE, "the provider handle chain is full; start a new session id"),
    "HOST_NOT_REGISTERED": (EX_UNAVAILABLE, "start this host's agent with `--coordinator ADDR` (or "
                                            "`holdfast up`), or pass the registered id with --host-id"),
    "WRONG_CLUSTER": (EX_UNAVAILABLE, "two holdfast clusters answer this coordinator address (e.g. two "
                                      "`holdfast up` on one port): stop the one that is not yours, and "
                                      "point --coordinator / HOLDFAST_COORDINATOR at the one that granted"),
    "UNAVAILABLE": (EX_UNAVAILABLE, "the coordinator cannot reach etcd; check etcd, then retry"),
    UNREACHABLE: (EX_UNAVAILABLE, "start one with `holdfast up`, or point --coordinator / "
                                  "HOLDFAST_COORDINATOR at a running coordinator"),
    "PERMISSION_DENIED": (EX_NOPERM, "the grant secret does not match; use the grant file of the current "
                                     "owner (HOLDFAST_GRANT_FILE)"),
    "FORCE_NOT_ALLOWED": (EX_NOPERM, "force ends only an owner whose handoff this caller asked for: "
                                     "`holdfast run --takeover --force` (the same takeover), or an operator "
                                     "certificate; nothing was signalled"),
    OWNER_ALIVE: (EX_TEMPFAIL, "end the owner first — `holdfast run --session {session} --takeover --force "
                               "-- CMD` from another host has its agent end the tree — or stop it on its "
                               "host; only if you mean to leave it running: add --yes"),
    TLS_FILE_MISSING: (EX_NOPERM, "make it with `holdfast certs init DIR` (`--add-missing` adds what an "
                                  "existing directory lacks), or point --tls-dir / HOLDFAST_TLS_DIR at the "
                                  "directory that has it"),
    TLS_HANDSHAKE_FAILED: (EX_NOPERM, "a certificate problem, not a missing coordinator: the coordinator's "
                                      "certificate is not from the CA in --tls-dir / HOLDFAST_TLS_DIR (or "
                                      "it serves plaintext: drop --tls-dir); check both sides' ca.pem"),
    "UNAUTHENTICATED": (EX_NOPERM, "present a client certificate the coordinator trusts"),
    "WRONG_ROLE": (EX_NOPERM, "use the certificate of your role: client.pem for runtimes (`run`, `put`), "
                              "operator.pem for `recover`, `drain` and `admin` (the CLI presents it from "
                              "--tls-dir), maintenance.pem for purge-archives, agent-<host id>.pem for "
                              "that host's agent (`holdfast certs init`, `--add-missing` for an older "
                              "directory)"),
    CMD_NOT_FOUND: (EX_NOTFOUND, "check the command's spelling, or give its path; `run` looks it up on "
                                 "PATH as the shell does"),
    CMD_NOT_EXECUTABLE: (EX_NOEXEC, "make it executable (`chmod +x`), or run it through its interpreter"),
    "INVALID_ARGUMENT": (EX_USAGE, "fix the argument; see `holdfast --help`"),
    "NOT_FOUND": (EX_FAILURE, "no such session; `holdfast status` lists the sessions"),
}


# `holdfast probe`'s answer as its exit status, so a script can branch on it (issue 17: it exited 0
# for all three). 0 means "the next run would be granted"; 3 and 4 stay clear of the codes a
# refusal or a failure uses (1, 2, 69, 75, 77).
PROBE_FREE, PROBE_HELD, PROBE_UNKNOWN = 0, 3, 4
PROBE_EXIT = {"free": PROBE_FREE, "grant": PROBE_FREE, "held": PROBE_HELD, "reserved": PROBE_HELD,
              "unknown": PROBE_UNKNOWN, "manual-recovery": PROBE_UNKNOWN}


def probe_exit(verdict: str) -> int:
    """A verdict this CLI does not know yet (a newer coordinator's) is unknown, never free."""
    return PROBE_EXIT.get(verdict, PROBE_UNKNOWN)


def exit_code(reason: str) -> int:
    return _TABLE.get(reason, (EX_FAILURE, ""))[0]


def next_step(reason: str, session: str = "SESSION", fence: int = 0) -> str:
    """`fence` is the session's current fence when the caller knows it (0: shown as N)."""
    step = _TABLE.get(reason, (EX_FAILURE, "see the coordinator's log"))[1]
    return step.format(session=session or "SESSION", fence=fence or "N") or "see the coordinator's log"
