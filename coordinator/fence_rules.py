"""Pure rules of fencing a lost host: the fencer settings, what a fence agent is told, what counts
as its proof, which hosts qualify and when, and what the proof frees (docs/operations.md, *A lost
host is fenced*).

Guarantee: no I/O and no clock reads. A host is "off" only on the fence-agents protocol's own
proof — `action=off` exits 0 printing `Success: Powered OFF` or `Success: Already OFF`, *then*
`action=status` exits 2 printing `Status: OFF`; anything else (another exit code or line, a
timeout, a program that would not start, more output than is read) is `unknown`, and `on` is
reported as such but proves nothing either. Time only makes a host a candidate (its registration
absent `host_loss_after` on the replica's monotonic clock); a registered, draining or restore-gated
host never is. A fencer's option can never smuggle in another option (no newline in a name or
value) nor set `action`; recorded output has every secret masked. The proof frees only owners
attested on the fenced incarnation, owners recorded before the proof on an earlier incarnation
that the fenced one proves ended, and reservations recorded before the proof; conflicted and
manual-recovery records stay as they are.

The other kind of fencer is Kubernetes' non-graceful node shutdown: the
`node.kubernetes.io/out-of-service` taint on the Node. It proves a host off only when it sits on the
Node uid the host's agent enrolled with (kept in its registered-last registration), none of this
replica's earlier reads of the Node since it saw that registration absent found it (its
`timeAdded` names the addition: the API server's own record, compared only with itself, never with
a clock), at least one such read answered before, and the Node is not Ready (what Kubernetes itself
requires before it force-deletes the node's pods). A deleted Node, a Node of another uid, a taint
without `timeAdded`, or one the first read after the lapse already found, prove nothing.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from holdfast.common.incarnation_rules import incarnation_verdict
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

OPTION_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
HOST_PLACEHOLDER = "{host}"
RESERVED_OPTIONS = frozenset({"action"})  # holdfast says which action; a setting never does
OFF_LINES = frozenset({"Success: Powered OFF", "Success: Already OFF"})
STATUS_OFF_LINE, STATUS_ON_LINE = "Status: OFF", "Status: ON"
STATUS_OFF_EXIT = 2  # fence-agents' `status` exits 2 exactly when the plug is off
MASK = "*****"
OUTPUT_KEPT = 2048  # characters of each stream recorded per action
MAX_BACKOFF_S = 600.0
FENCER_KEYS = frozenset({"hosts", "kind", "program", "options", "secrets"})
FENCE_AGENT, KUBERNETES = "fence-agent", "kubernetes-out-of-service"  # the kinds of fencer
KUBE_OPTIONS = frozenset({"api_server", "api_ca", "api_token_file"})  # none: in-cluster configuration
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
KUBE_PROGRAM = f"the Kubernetes taint {OUT_OF_SERVICE}"  # what an attempt of that kind names as its program
READ_NODE = "read-node"  # the one action of the taint fencer
# Agents whose "off" proves nothing, refused by the name of the file the path resolves to (a link
# named fence_power to fence_dummy is fence_dummy), and why.
PROVE_NOTHING = {
    "fence_dummy": "flips a state file on the coordinator's own disk and powers nothing off",
    "fence_ack_manual": "is a person's override after fencing failed and sees no node",
    "fence_zvmip": ("answers 'Success: Already OFF' for a guest its hypervisor does not know (its "
                    "missing_as_off is on by default), so a wrong or renamed plug proves a running node off"),
}
# fence-agents' missing_as_off makes a plug the device does not know answer off: the device never
# saw the node, yet the agent prints the proof's lines. The library keeps a boolean option's key
# whatever its value (`missing_as_off=false` is stored as "0") and the agents test only that the key
# is there, so the option is refused whatever it holds.
MISSING_AS_OFF = "missing_as_off"
# The library's other flags, read the same way: `name = false` turns them on (`ssl_insecure = false`
# skips the device's certificate). Under either name the library takes (its own, or the long option).
FLAGS = frozenset({"verbose", "secure", "ssh", "ssl", "ssl_insecure", "ssl_secure", "notls", "inet4_only",
                   "inet6_only", "sudo", "use_sudo", "port_as_ip", "quiet", "help", "version"})
FALSE_WORDS = frozenset({"0", "no", "off", "false"})  # the library's false words, which it stores as "0"
# The library's options that name what is fenced: the plug (`port` is its own name for it; an agent
# with an address and no plug takes the plug as that address) and the device's address. A pattern
# fencer's {host} must be in one of them: any other option may be one the agent does not read (the
# library drops `nodename` silently and any option unknown to the agent with only a warning).
ADDRESSING = ("plug", "port", "ip", "ipaddr")
SAME_OPTION = {"port": "plug", "ipaddr": "ip"}  # the library's own name → its long option's
PATTERN_CHARS = frozenset("*?[")
HOST_LOST = "host lost"  # `requested_by` of an attempt the loop started


class Answer(StrEnum):
    OFF = "off"
    ON = "on"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class FencerSpec:
    """One configured fencer: the hosts it answers for (a host id or an fnmatch pattern), the agent
    program (an absolute path), its options, and options whose values are read from files."""

    hosts: str
    program: str
    options: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()  # option name → file holding its value
    kind: str = FENCE_AGENT


# --- settings -----------------------------------------------------------------------------------
def parse_fencers(raw: Any) -> tuple[FencerSpec, ...]:
    """The `fencers` setting: a list of tables (TOML `[[coordinator.fencers]]`) or the same list as
    JSON text (a flag or HOLDFAST_FENCERS). ValueError names the entry and what is wrong."""
    if isinstance(raw, str):
        if not raw.strip():
            return ()
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not a JSON list of fencers: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError("must be a list of fencers (each a table with hosts, program, options, secrets)")
    return tuple(_fencer(i, entry) for i, entry in enumerate(raw))


def _fencer(index: int, entry: Any) -> FencerSpec:
    where = f"fencer {index + 1}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a table")
    unknown = sorted(set(entry) - FENCER_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(FENCER_KEYS))}")
    hosts, program, kind = entry.get("hosts"), entry.get("program"), entry.get("kind", FENCE_AGENT)
    if not isinstance(hosts, str) or not hosts.strip():
        raise ValueError(f"{where}: hosts must name a host id or a pattern (e.g. \"node-*\")")
    if kind == KUBERNETES:
        return _kube_fencer(where, hosts, entry)
    if kind != FENCE_AGENT:
        raise ValueError(f"{where}: kind must be {FENCE_AGENT!r} (the default) or {KUBERNETES!r}")
    if not isinstance(program, str) or not program.startswith("/"):
        raise ValueError(f"{where}: program must be the fence agent's absolute path, e.g. "
                         "/usr/sbin/fence_ipmilan")
    why = proves_nothing(program)
    if why:
        raise ValueError(f"{where}: {why}")
    options = _table(where, "options", entry.get("options", {}))
    secrets = _table(where, "secrets", entry.get("secrets", {}))
    why = (_read_as_one(options, secrets) or _off_without_device(options, secrets)
           or _one_plug_for_many(hosts, options))
    if why:
        raise ValueError(f"{where}: {why}")
    for name, path in secrets.items():
        if not path.startswith("/"):
            raise ValueError(f"{where}: secrets.{name} must be the absolute path of the file holding it")
    both = sorted(set(options) & set(secrets))
    if both:
        raise ValueError(f"{where}: option {both[0]!r} is both in options and in secrets")
    return FencerSpec(hosts, program, tuple(sorted(options.items())), tuple(sorted(secrets.items())))


def proves_nothing(program: str) -> str:
    """Why the agent at `program` (a path, resolved by the caller when it can be) proves nothing, or
    ''. Checked on the configured path here and on the resolved file at start (fencers.check_fencers)."""
    name = program.rsplit("/", 1)[-1]
    if name not in PROVE_NOTHING:
        return ""
    return (f"{program} is {name}, which proves nothing: it {PROVE_NOTHING[name]}; configure the host's "
            "power or cloud API agent, or none and recover by hand")


def _option_name(name: str) -> str:
    """The option as the fence-agents library reads it (it takes `-` and `_` alike)."""
    return name.replace("-", "_")


def _read_as_one(options: Mapping[str, str], secrets: Mapping[str, str]) -> str:
    """Why two of these names are one option to the library, or '': it takes `-` and `_` alike and
    `port` for `plug`, `ipaddr` for `ip`, and keeps the later line, so `plug = "{host}"` beside
    `port = 623` fenced every host through plug 623."""
    seen: dict[str, str] = {}
    for name in dict.fromkeys([*options, *secrets]):  # one name in both is refused as such below
        option = _option_name(name)
        option = SAME_OPTION.get(option, option)
        if option in seen:
            return (f"options {seen[option]!r} and {name!r} are one option to fence-agents (the later "
                    "line wins): keep one")
        seen[option] = name
    return ""


def _off_without_device(options: Mapping[str, str], secrets: Mapping[str, str]) -> str:
    """Why these options make the agent answer off for a plug its device does not know, or turn on
    what they name off, or ''."""
    if any(_option_name(name) == MISSING_AS_OFF for name in [*options, *secrets]):
        return (f"option {MISSING_AS_OFF} makes the agent answer 'Success: Already OFF' and 'Status: OFF' "
                "for a plug its device does not know (a typo, a renamed or moved VM): that is no proof the "
                "node is off; remove it (any value turns it on, false included: fence-agents reads only "
                "that it is there)")
    flag = next((name for name, value in options.items() if _option_name(name) in FLAGS
                 and value.strip().strip('"').lower() in FALSE_WORDS), "")
    if flag:
        return (f"option {flag} = {options[flag]!r} turns it on: fence-agents reads only that a flag is "
                "there; leave it out to leave it off")
    return ""


def _one_plug_for_many(hosts: str, options: Mapping[str, str]) -> str:
    """Why a pattern fencer would fence every host it matches through the same plug, or ''. Without
    `{host}` in the plug or the address, each matching host's attempt asks the device about the same
    thing, and one answer would "prove" every one of them off."""
    if not PATTERN_CHARS & set(hosts) or any(
            HOST_PLACEHOLDER in value for name, value in options.items() if _option_name(name) in ADDRESSING):
        return ""
    return (f"hosts {hosts!r} is a pattern but none of the options {', '.join(ADDRESSING)} holds "
            f"{HOST_PLACEHOLDER}: every host it matches would be fenced through the same plug (put "
            f"{HOST_PLACEHOLDER} in the plug or the device's address, or configure one fencer per host; "
            f"{HOST_PLACEHOLDER} anywhere else may be in an option the agent never reads)")


def _kube_fencer(where: str, hosts: str, entry: dict[str, Any]) -> FencerSpec:
    """The out-of-service taint: no program and no secrets, only how to reach the API server."""
    extra = sorted({"program", "secrets"} & set(entry))
    if extra:
        raise ValueError(f"{where}: kind {KUBERNETES!r} takes no {extra[0]} (it reads the host's Node)")
    options = _table(where, "options", entry.get("options", {}))
    unknown = sorted(set(options) - KUBE_OPTIONS)
    if unknown:
        raise ValueError(f"{where}: unknown option {unknown[0]!r} for kind {KUBERNETES!r}; known: "
                         f"{', '.join(sorted(KUBE_OPTIONS))} (none: the in-cluster configuration)")
    return FencerSpec(hosts, KUBE_PROGRAM, tuple(sorted(options.items())), kind=KUBERNETES)


def _table(where: str, what: str, raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: {what} must be a table of name = value")
    out = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not OPTION_NAME.fullmatch(name):
            raise ValueError(f"{where}: {what} name {str(name)[:40]!r} must match {OPTION_NAME.pattern}")
        if name in RESERVED_OPTIONS:
            raise ValueError(f"{where}: {what}.{name} is set by holdfast itself (off, then status)")
        out[name] = check_value(f"{where}: {what}.{name}", _text(value, f"{where}: {what}.{name}"))
    return out


def _text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float | str):
        return str(value)
    raise ValueError(f"{where} must be a string, a number or a boolean")


def check_value(where: str, value: str) -> str:
    """A value is one line: a newline in it would add an option of its own choosing."""
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"{where} must not contain a newline or NUL (it would add another option)")
    return value


def fencer_for(specs: Iterable[FencerSpec], host_id: str) -> FencerSpec | None:
    """The first fencer whose `hosts` is the id or a pattern matching it; None: nobody fences it."""
    for spec in specs:
        if spec.hosts == host_id or fnmatch.fnmatchcase(host_id, spec.hosts):
            return spec
    return None


def agent_options(spec: FencerSpec, host_id: str, secret_values: Mapping[str, str]) -> list[tuple[str, str]]:
    """The options for one host, `{host}` in a value replaced by its id, secrets included."""
    options = [(name, value.replace(HOST_PLACEHOLDER, host_id)) for name, value in spec.options]
    options += [(name, check_value(f"secret {name}", secret_values[name])) for name, _ in spec.secrets]
    return options


def stdin_text(action: str, options: Iterable[tuple[str, str]]) -> str:
    """The fence-agents stdin protocol: `name=value` lines, the action first."""
    return "".join(f"{name}={value}\n" for name, value in [("action", action), *options])


def secret_of(text: str) -> str:
    """A secret file's content as the option's value: its first line, without the line ending."""
    lines = text.splitlines()
    return lines[0] if lines else ""


def mask(text: str, secrets: Iterable[str]) -> str:
    """Every secret value masked (longest first, so one secret inside another is not half-shown),
    then cut to OUTPUT_KEPT characters."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text[:OUTPUT_KEPT]


# --- proof --------------------------------------------------------------------------------------
def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines()}


def _failed(result: pb.FenceAction) -> str:
    """Why an action's run says nothing: it did not start, timed out, or printed more than is read.
    '' when it ended."""
    if not result.ran:
        return f"{result.action} could not be run: {result.error}"
    if result.timed_out:
        return f"{result.action} did not finish within the fence timeout (its process group was killed)"
    if result.error:  # it ran, but what it printed cannot be judged whole
        return f"{result.action} {result.error}"
    return ""


def judge(off: pb.FenceAction, status: pb.FenceAction | None) -> tuple[Answer, str]:
    """The answer of an off-then-status pair, and why. Only the protocol's exact lines prove."""
    why = _failed(off)
    if why:
        return Answer.UNKNOWN, why
    if off.exit_code != 0:
        return Answer.UNKNOWN, f"off exited {off.exit_code}"
    if not _lines(off.stdout) & OFF_LINES:
        return Answer.UNKNOWN, ("off exited 0 without printing 'Success: Powered OFF' or "
                                "'Success: Already OFF'")
    if status is None:
        return Answer.UNKNOWN, "status was not asked"
    why = _failed(status)
    if why:
        return Answer.UNKNOWN, why
    printed = _lines(status.stdout)
    if status.exit_code == 0 and STATUS_ON_LINE in printed and STATUS_OFF_LINE not in printed:
        return Answer.ON, "status after off reports the host ON"
    if status.exit_code == STATUS_OFF_EXIT and STATUS_OFF_LINE in printed and STATUS_ON_LINE not in printed:
        return Answer.OFF, "off succeeded and status reports OFF"
    return Answer.UNKNOWN, (f"status exited {status.exit_code} without printing exactly '{STATUS_OFF_LINE}' "
                            f"with exit {STATUS_OFF_EXIT}")


def needs_status(off: pb.FenceAction) -> bool:
    """Status is asked only after an off that could still be part of a proof."""
    return not _failed(off) and off.exit_code == 0 and bool(_lines(off.stdout) & OFF_LINES)


# --- the out-of-service taint ------------------------------------------------------------------
def _out_of_service(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [t for t in ((node or {}).get("spec") or {}).get("taints") or []
            if isinstance(t, dict) and t.get("key") == OUT_OF_SERVICE]


@dataclass
class TaintSightings:
    """What this replica's reads of a lost host's Node found since it first saw the host's
    registration absent: whether one answered, and the `timeAdded` of each out-of-service taint
    found. Each read is made after the lapse, so a taint none of them found, met by a later read,
    was added after the lapse — on the API server's own record, whatever any clock says. A taint
    left from an earlier outage, or put on while the agent still registered, is found by the first
    read and never proves this loss (a clock comparison took a leftover taint as proof whenever the
    replica's clock ran behind the API server's by more than the leftover's age)."""

    looked: bool = False
    added: set[str] = field(default_factory=set)

    def saw(self, node: dict[str, Any] | None) -> None:
        self.looked = True
        self.added.update(str(t.get("timeAdded")) for t in _out_of_service(node))


def _ready(node: dict[str, Any]) -> str:
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((str(c.get("status")) for c in conditions
                 if isinstance(c, dict) and c.get("type") == "Ready"), "absent")


def judge_taint(node: dict[str, Any] | None, name: str, enrolled_uid: str,
                sightings: TaintSightings) -> tuple[Answer, str, str]:
    """The answer of one read of Node `name` (None: 404), why, and what was read (for the record),
    judged against the reads before it (`sightings`, which the caller then updates with this one)."""
    if not enrolled_uid:
        return Answer.UNKNOWN, ("the host's agent registered with no Node uid in its certificate (not "
                                "enrolled by holdfast's issuer): no Node can speak for it"), "not read"
    if node is None:
        return Answer.UNKNOWN, (f"Node {name} does not exist: a deleted Node is not proof (kubelet creates "
                                "it again with a new uid, and containers outlive a stopped kubelet)"), \
            f"Node {name}: not found"
    uid = str((node.get("metadata") or {}).get("uid") or "")
    taints = _out_of_service(node)
    ready = _ready(node)
    taint = taints[0] if taints else {}
    added = taint.get("timeAdded")
    seen = (f"Node {name} uid {uid}: " + (f"taint {OUT_OF_SERVICE}={taint.get('value', '')}:"
                                          f"{taint.get('effect', '')} added {added}"
                                          if taints else f"no {OUT_OF_SERVICE} taint") + f"; Ready {ready}")
    if uid != enrolled_uid:
        return Answer.UNKNOWN, (f"Node {name} has uid {uid}, not {enrolled_uid} the host enrolled with: "
                                "another machine took the name"), seen
    if not taints:
        return Answer.UNKNOWN, f"Node {name} has no {OUT_OF_SERVICE} taint", seen
    if not isinstance(added, str) or not added:
        return Answer.UNKNOWN, (f"the taint on Node {name} has no timeAdded (only a NoExecute taint gets "
                                "one)"), seen
    if not sightings.looked:
        return Answer.UNKNOWN, (f"this is the first read of Node {name} since this replica saw the host's "
                                "registration lapse: a taint it finds may be older than the loss (remove "
                                "it and add it again)"), seen
    if added in sightings.added:
        return Answer.UNKNOWN, (f"the taint on Node {name} (added {added}) was already there when this "
                                "replica read the Node after the registration lapsed: it says nothing of "
                                "this loss (remove it and add it again)"), seen
    if ready == "True":
        return Answer.ON, f"Node {name} is Ready: its kubelet still reports", seen
    return Answer.OFF, (f"the {OUT_OF_SERVICE} taint on Node {name} (uid {uid}, the one the host enrolled "
                        f"with), added {added}, was not there when this replica read the Node after the "
                        "registration lapsed, and the Node is not Ready"), seen


# --- which hosts, when ---------------------------------------------------------------------------
def freeable(record: pb.SessionRecord) -> str:
    """The host a fence of which could free this record ('' for none): its committed owner's or its
    reservation's. Conflicted and manual-recovery records are ended only by Recover."""
    lease = record.lease
    if lease.handoff_stage == pb.MANUAL_RECOVERY:
        return ""
    if lease.claim_status in (pb.COMMITTED, pb.LIVE):
        return lease.owner.host_id
    if lease.claim_status == pb.RESERVED:
        return lease.reserved_host_id
    return ""


def hosts_named(records: Iterable[pb.SessionRecord]) -> set[str]:
    """Every host some record names as a freeable owner or reservation."""
    return {host for host in map(freeable, records) if host}


def lost_for(absent_since: float | None, now: float) -> float:
    """Seconds this replica has seen the registration absent (0 when it is present)."""
    return 0.0 if absent_since is None else max(now - absent_since, 0.0)


def due(absent_since: float | None, now: float, host_loss_after: float, retry_at: float | None) -> bool:
    """A candidate: absent `host_loss_after` on this replica's monotonic clock, and past any backoff."""
    return (absent_since is not None and now - absent_since >= host_loss_after
            and (retry_at is None or now >= retry_at))


def backoff(failures: int, first: float, kind: str = FENCE_AGENT) -> float:
    """Seconds before the next attempt after `failures` consecutive unproven ones: doubling, capped,
    so a failing device is not hammered. The taint fencer's attempt is one Node read that waits for a
    person's taint: it is asked again every `first` seconds, so a taint is acted on soon after it is
    set (as Kubernetes acts on it), however long the host had been lost before."""
    if kind == KUBERNETES:
        return first
    return min(first * 2 ** max(failures - 1, 0), max(first, MAX_BACKOFF_S))


@dataclass(frozen=True)
class Gates:
    """What a fence's first transaction reads besides its own key, decoded."""

    registered: bool
    draining: bool
    restore_pending: bool
    pending: bool
    last: pb.HostRegistration | None  # the registered-last registration, without a lease
    fenced: pb.FenceAttempt | None


def refusal(gates: Gates, manual: bool = False) -> str:
    """Why no fence may start now ('' when one may). Registered agents are never fenced; a draining
    host is left to the operator draining it, who may fence it by hand; while a restore is pending
    the records may be stale, so only an operator fences (restore-epoch counts a host proven off
    since the restore as searched)."""
    if gates.registered:
        return "the host has a live agent registration"
    if gates.draining and not manual:
        return "the host is draining (an operator is handling it)"
    if gates.restore_pending and not manual:
        return "restore-epoch has not finished (`holdfast admin fence` may fence it)"
    if gates.pending:
        return "a fence of this host is already running"
    if gates.last is None:
        return ("no registered-last incarnation is kept for this host (it last registered before fencing "
                "existed); recover it with `holdfast admin recover-host`")
    return ""


def unprovable(spec: FencerSpec, last: pb.HostRegistration) -> str:
    """Why this fencer can never prove this registration off ('' when it may): the taint fencer needs
    the Node uid an enrolled agent's certificate carried. No attempt is made (none could succeed)."""
    if spec.kind == KUBERNETES and not last.node_uid:
        return ("its agent's certificate names no Node uid (not enrolled by holdfast's issuer), so no "
                f"{OUT_OF_SERVICE} taint can prove it off; recover it with `holdfast admin recover-host`")
    return ""


def already_fenced(gates: Gates) -> bool:
    """The incarnation it last registered with was fenced already: nothing to power off again."""
    return gates.fenced is not None and gates.last is not None and same_incarnation(
        gates.fenced.incarnation, gates.last.incarnation)


def same_incarnation(a: apb.HostIncarnation, b: apb.HostIncarnation) -> bool:
    return (a.machine_id, a.boot_id, a.pid_ns, a.ns_init_start_ticks) == (
        b.machine_id, b.boot_id, b.pid_ns, b.ns_init_start_ticks)


def registration_refused(registering: apb.HostIncarnation, pending: bool,
                         fenced: pb.FenceAttempt | None) -> str:
    """RegisterHost's fencing gates: '' to admit, else why not. A power-off cannot be called back,
    and an incarnation proven off that answers again means the proof was wrong."""
    if pending:
        return "a fence of this host is running; a power-off cannot be called back"
    if fenced is not None and same_incarnation(fenced.incarnation, registering):
        return ("this very incarnation was fenced (proven off) and is registering again: the fence device "
                "lied or fenced another machine")
    return ""


def recoverable(record: pb.SessionRecord, host_id: str, fenced: pb.FenceAttempt, record_revision: int,
                fenced_revision: int) -> bool:
    """Freed by the proof: an owner attested on the fenced incarnation of this host; an owner of an
    earlier incarnation that the fenced one proves ended (a later boot of the same machine, or its
    PID namespace inode given to a new namespace), in a record written before the proof; or a
    reservation on this host written before the proof. Before the proof means before the fence
    began: no registration, so no attestation, exists on a host while its fence is pending, and the
    fenced incarnation is the last one that registered — so an owner recorded before the proof is
    of that incarnation or of an earlier one, never of a later one. An owner left from before a
    reboot, whose session nobody took, would otherwise stay stranded while its fenced host stays
    down (no agent to probe it). Anything later is a new incarnation's, untouched."""
    lease = record.lease
    if freeable(record) != host_id:
        return False
    if lease.claim_status == pb.RESERVED:
        return record_revision < fenced_revision
    owner = lease.owner.incarnation
    return same_incarnation(owner, fenced.incarnation) or (
        record_revision < fenced_revision and incarnation_verdict(owner, fenced.incarnation)[0] == "ended")


def evidence_detail(attempt: pb.FenceAttempt) -> str:
    """`host-fenced` evidence for a person: program, each action's result, which coordinator, when."""
    actions = "; ".join(f"{a.action}: {_outcome(a)}" for a in attempt.actions)
    return (f"host {attempt.host_id} fenced by {attempt.program} ({actions}) from {attempt.coordinator} "
            f"at {attempt.ended_at_unix_ms} ms; {attempt.requested_by}")


def _outcome(action: pb.FenceAction) -> str:
    if action.action == READ_NODE and action.ran:
        return action.stdout.strip()
    if not action.ran:
        return f"not run ({action.error})"
    if action.timed_out:
        return "timed out"
    last = action.stdout.strip().splitlines()[-1:] or [""]
    return f"exit {action.exit_code}" + (f" {last[0]!r}" if last[0] else "")


def failures_after(attempt: pb.FenceAttempt) -> int:
    """Consecutive unproven attempts counting this one (0 after a proof)."""
    return 0 if attempt.answer == Answer.OFF else attempt.failures + 1
