"""`holdfast run`, the fenced data commands (`put`, `get`) and the operator commands (`status`,
`show`, `probe`, `recover`, `hosts`).

Guarantee: `run` exits with CMD's status, or — when CMD never ran — 75 held/unknown, 69 no
coordinator, 77 authentication, 2 usage (docs/design.md §6); every read command's `--json` output is
one JSON document, errors included; every error names the next step.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from holdfast.cli.options import (
    as_dict,
    client_options,
    command,
    default_operator,
    fence_arg,
    guard_url,
    interrupted,
    print_json,
    schema,
    seconds_arg,
    session_id_arg,
    terminated,
)
from holdfast.client.acquire import MAX_WAIT_S, RunSpec, say_stderr
from holdfast.client.connection import OWNED, Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.client.owner import Owner, status_of
from holdfast.common import env, files, reasons
from holdfast.common.names import claim_name, outcome_name, stage_name
from holdfast.common.reasons import Reason
from holdfast.v1 import coordinator_pb2 as pb


def _when(unix_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_ms / 1000)) if unix_ms else "-"


def _incarnation(inc: Any) -> str:
    return f"{inc.boot_id[:8]}/{inc.pid_ns}" if inc.boot_id else "-"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in [header, *rows])


def session_row(record: pb.SessionRecord) -> list[str]:
    lease = record.lease
    owner = lease.owner
    host = owner.host_id or lease.reserved_host_id or "-"
    return [record.session_id, host, _incarnation(owner.incarnation), str(owner.pid or "-"), str(lease.fence),
            claim_name(lease.claim_status), stage_name(lease.handoff_stage),
            _when(lease.owner_since_unix_ms or lease.reserved_at_unix_ms), record.tenant or "(default)"]


SESSION_HEADER = ["SESSION", "HOST", "INCARNATION", "PID", "FENCE", "CLAIM", "STAGE", "SINCE", "TENANT"]
HOST_HEADER = ["HOST", "ADDRESS", "INCARNATION", "TOKEN VARIABLE", "VERSION", "REGISTERED", "DRAINING"]


def host_row(host: pb.HostRegistration) -> list[str]:
    return [host.host_id, host.address, _incarnation(host.incarnation), host.spawn_token_env,
            host.agent_version, _when(host.registered_at_unix_ms), "yes" if host.draining else "no"]


def host_rows(listing: pb.ListHostsResponse) -> list[list[str]]:
    """Every registered host, then every draining host with no registration (its agent is down,
    e.g. for the maintenance the drain is for): a drain is shown until `drain --undo`."""
    registered = {h.host_id for h in listing.hosts}
    return [*(host_row(h) for h in listing.hosts),
            *([h, "-", "-", "-", "-", "not registered", "yes"]
              for h in listing.draining_host_ids if h not in registered)]


FENCE_HEADER = ["LOST HOST", "ABSENT SINCE", "FENCE", "FENCER", "LAST ATTEMPT"]


def fence_row(state: pb.HostFenceState) -> list[str]:
    """A host without a registration (or with a fence pending): since when this coordinator has
    seen it absent, where its fencing stands, and why, as its last attempt recorded it."""
    attempt = state.attempt
    at = _when(attempt.ended_at_unix_ms or attempt.started_at_unix_ms)
    last = (f"{attempt.answer or 'running'} at {at}: {attempt.detail or attempt.requested_by}"
            if attempt.started_at_unix_ms else "-")
    return [state.host_id, _when(state.absent_since_unix_ms), state.state or "none",
            state.fencer or "none configured", last]


def hosts_json(listing: pb.ListHostsResponse) -> dict[str, object]:
    """`hosts` as JSON: `draining` on every host (false included), every draining host id, and
    every host that is lost or being fenced, with its fence state."""
    return {"hosts": [{**as_dict(h), "draining": h.draining} for h in listing.hosts],
            "draining": list(listing.draining_host_ids),
            "fencing": [as_dict(s) for s in listing.fence_states]}


# --- run -------------------------------------------------------------------------------------------
def run_report(session: str, exit_code: int, cmd_status: int | None, fence: int = 0,
               error: ClientError | None = None) -> dict[str, object]:
    """`run --report`'s document: whether CMD ran, `run`'s exit code and CMD's own status, and the
    reason when `run` refused or failed. `reason` is "" exactly when CMD ran and `run` ended cleanly,
    so a CMD that exits 75 itself (ran, reason "") is told apart from a refusal (not ran, HELD)."""
    return schema({"ran": cmd_status is not None or fence > 0, "exit_code": exit_code,
                   "cmd_status": cmd_status, "reason": error.reason if error else "",
                   "message": error.message if error else "", "next_step": error.next_step if error else "",
                   "session": session, "fence": fence})


def write_report(path: str, report: dict[str, object]) -> None:
    """Whole or not at all, never through a link planted at `path` or beside it (common/files)."""
    target = os.path.abspath(path)
    directory, _ = files.open_user_dir(os.path.dirname(target))  # through no link another user planted
    try:
        files.write_whole(directory, os.path.basename(target),
                          (json.dumps(report, sort_keys=True) + "\n").encode(), mode=0o644)
    finally:
        os.close(directory)


async def _run(args: argparse.Namespace, client: Client) -> int:
    spec = RunSpec(session_id=args.session, argv=args.cmd, provider=args.provider, location=args.location,
                   takeover=args.takeover, force=args.force, handoff_timeout=args.handoff_timeout,
                   wait=args.wait or 0.0, grace=args.grace, guards=args.guard, carry=args.carry,
                   carry_every=args.carry_every or 0.0, made_at_grant=args.made_at_grant)
    outcome = args.outcome  # what the handler's --report says; filled as far as the run got
    # A session pod's own certificate is renewed for as long as `run` lasts: its wait, CMD, the release.
    renewal = (asyncio.create_task(client.enroller.renew_forever(client.renewed, say_stderr))
               if client.enroller is not None else None)
    try:
        return await _run_owner(spec, client, outcome)
    finally:
        if renewal is not None:
            renewal.cancel()


async def _run_owner(spec: RunSpec, client: Client, outcome: dict[str, Any]) -> int:
    # A SIGTERM before CMD runs (a service manager's stop, a pod's deletion) ends `run` as a Ctrl-C
    # does: the gate ended unrun and a grant released, where its default death left the grant to
    # the next probe and the grant directory to the next `run` of the pid namespace. Once CMD runs,
    # supervise forwards it to CMD.
    loop, starting = asyncio.get_running_loop(), asyncio.current_task()
    assert starting is not None
    by_term: list[int] = []

    def stop() -> None:
        by_term.append(signal.SIGTERM)
        starting.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        owner = await Owner.start(client, spec)
    except ClientError as err:
        outcome["error"] = err
        raise
    except asyncio.CancelledError:  # Ctrl-C or SIGTERM: Owner.start ended the gate unrun and released
        outcome["error"] = terminated() if by_term else interrupted()
        if by_term:
            raise outcome["error"] from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    outcome["fence"] = owner.grant.fence
    try:
        status = await owner.supervise(forward_signals=True)  # `holdfast run` passes signals on to CMD
    except (ClientError, asyncio.CancelledError) as exc:  # what came after CMD's start failed
        outcome["error"] = exc if isinstance(exc, ClientError) else interrupted()
        if owner.gate.process.returncode is not None:
            outcome["cmd_status"] = status_of(owner.gate.process.returncode)
        raise
    outcome["cmd_status"] = status
    return status


# --- fenced data -----------------------------------------------------------------------------------
def _grant_file(args: argparse.Namespace) -> Grant:
    path = args.grant_file or os.environ.get(env.GRANT_FILE)
    if not path:
        raise ClientError(Reason.INVALID_ARGUMENT, "no grant: `put` and `handle` run inside `holdfast run` "
                          "(HOLDFAST_GRANT_FILE) or takes --grant-file")
    try:
        grant = Grant.from_file(path)
    except (OSError, ValueError, TypeError) as exc:
        raise ClientError(Reason.INVALID_ARGUMENT, f"cannot read the grant file {path}: {exc}") from None
    session = os.environ.get(env.SESSION)
    if not args.grant_file and session and grant.session_id != session:
        # Both were set by the same `run`: a grant of another session found at its path is not
        # this CMD's (its directory replaced meanwhile), and would write as that session's owner.
        raise ClientError(Reason.INVALID_ARGUMENT, f"the grant file {path} ($HOLDFAST_GRANT_FILE) holds a "
                          f"grant of session {grant.session_id!r}, but this CMD runs for session {session!r} "
                          "($HOLDFAST_SESSION); nothing was written")
    return grant


async def _put(args: argparse.Namespace, client: Client) -> int:
    grant = _grant_file(args)
    value = sys.stdin.buffer.read() if args.value in (None, "-") else args.value.encode()
    revision = await client.fenced_put(grant, args.key, value)
    if args.json:
        print_json({"session_id": grant.session_id, "fence": grant.fence, "key": args.key,
                     "revision": revision})
    else:
        print(f"put {args.key} at fence {grant.fence} (revision {revision})")
    return 0


async def _handle(args: argparse.Namespace, client: Client) -> int:
    grant = _grant_file(args)
    record = await client.record_provider_handle(grant, args.handle)
    if args.json:
        print_json(as_dict(record))
    else:
        links = len(record.provider_handle_chain)
        print(f"provider handle recorded at fence {grant.fence} ({links} in the chain)")
    return 0


async def _get(args: argparse.Namespace, client: Client) -> int:
    session = args.session or os.environ.get(env.SESSION, "")
    if not session:
        raise ClientError(Reason.INVALID_ARGUMENT,
                          "which session? pass --session or run inside `holdfast run`")
    found = await client.fenced_get(session, args.key)
    if args.json:
        out: dict[str, object] = {"session_id": session, "key": args.key, "found": found.found}
        if found.found:
            out["revision"] = found.revision
            out["value_base64"] = base64.b64encode(found.value).decode()
            with contextlib.suppress(UnicodeDecodeError):  # binary: value_base64 only
                out["value"] = found.value.decode()
        print_json(out)
        return 0 if found.found else reasons.EX_FAILURE
    if not found.found:
        print(f"holdfast: {args.key} is not set in session {session}. Next: `holdfast put` it from inside "
              "`holdfast run`", file=sys.stderr)
        return reasons.EX_FAILURE
    # A line, as etcdctl and consul print a value (it ended without one); --raw: the bytes alone.
    sys.stdout.buffer.write(found.value if args.raw else found.value + b"\n")
    return 0


# --- operator commands -----------------------------------------------------------------------------
async def _status(args: argparse.Namespace, client: Client) -> int:
    if args.watch:
        return await _status_watch(args, client)
    listing, sessions = await client.host_listing(), await client.list_sessions()
    if args.json:
        print_json({"coordinator": client.address, **hosts_json(listing),
                     "sessions": [as_dict(r) for r in sessions]})
        return 0
    draining = f", {len(listing.draining_host_ids)} draining" if listing.draining_host_ids else ""
    print(f"coordinator {client.address}: {len(listing.hosts)} hosts{draining}, {len(sessions)} sessions\n")
    print(table(host_rows(listing), HOST_HEADER) + "\n")
    print(table([session_row(r) for r in sessions], SESSION_HEADER))
    return 0


def watch_line(event: pb.SessionEvent) -> dict[str, object]:
    """One `status --watch --json` line: the session as it is now (`listed`: at the start, or again
    after a reconnect), as it changed, or deleted (archived)."""
    kind = "deleted" if event.deleted else "listed" if event.resync else "changed"
    return {"event": kind, "session_id": event.record.session_id,
            **({} if event.deleted else {"record": as_dict(event.record)})}


def _reconnecting(err: ClientError) -> None:
    print(f"holdfast: lost the watch ({err.message}); reconnecting", file=sys.stderr, flush=True)


async def _status_watch(args: argparse.Namespace, client: Client) -> int:
    """The sessions now, then one row (or JSON line) per change, as `kubectl get --watch` does,
    until interrupted (exit 0) or the coordinator refuses the watch. A coordinator never reached
    fails it as `status` fails (69, 77: a watch that never connected would otherwise retry silently
    forever); one lost later is reconnected to, said on stderr."""
    await client.host_listing()  # the first answer: any failure here is the command's exit
    widths = [len(h) for h in SESSION_HEADER]
    if not args.json:
        # Flushed: piped (`status -w | tee log`), the header would otherwise wait for the first change.
        print("  ".join(h.ljust(w) for h, w in zip(SESSION_HEADER, widths, strict=True)).rstrip(), flush=True)
    try:
        async for event in client.session_events(lost=_reconnecting):
            if args.json:
                print(json.dumps(schema(watch_line(event)), sort_keys=True), flush=True)
                continue
            row = session_row(event.record) if not event.deleted else [event.record.session_id, "(archived)"]
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)] + widths[len(row):]
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip(), flush=True)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the watch
        return 0
    return 0


async def _carried(client: Client, session: str) -> tuple[pb.GetCarryResponse | None, str]:
    """The session's carried state, or why it is not known (a coordinator older than --carry)."""
    try:
        return await client.get_carry(session, with_budget=True), ""
    except ClientError as err:
        return None, err.message


async def _show(args: argparse.Namespace, client: Client) -> int:
    from holdfast.common import carry_rules  # only `show` reads a copy: ~0.5 ms of every `run`'s start

    found = await client.get_session(args.session)
    carried, unknown = await _carried(client, args.session)
    manifest = carried.manifest if carried is not None and carried.found else None
    if args.json:
        carry_doc: dict[str, object] | None = None
        if manifest is not None:
            carry_doc = {"fence": manifest.fence, "host_id": manifest.host_id, "reason": manifest.reason,
                         "written_at_unix_ms": manifest.written_at_unix_ms,
                         "total_bytes": manifest.total_bytes,
                         "roots": [{"path": path, "files": files, "bytes": size}
                                   for path, files, size in carry_rules.root_sizes(manifest)]}
        budget = budget_doc(carried.budget) if carried is not None and carried.HasField("budget") else None
        print_json({"record": as_dict(found.record), "history": [as_dict(h) for h in found.history],
                    "carried": carry_doc, "carry_budget": budget,
                    **({"carried_unknown": unknown} if unknown else {})})
        return 0
    print(table([session_row(found.record)], SESSION_HEADER) + "\n")
    if manifest is not None:
        for path, files, size in carry_rules.root_sizes(manifest):
            print(f"carried state: {carry_rules.describe(manifest, path, files, size, time.time())}")
    elif unknown:
        print(f"carried state: unknown ({unknown})")
    if carried is not None and carried.HasField("budget"):
        print(budget_line(carried.budget))
    lease = found.record.lease
    if lease.death_evidence.kind:
        ev = lease.death_evidence
        print(f"last evidence: {ev.kind} {ev.detail} at {_when(ev.observed_at_unix_ms)} "
              f"(fence {ev.owner_fence})")
    for link in found.record.provider_handle_chain:
        print(f"provider handle at fence {link.minted_at_fence}: {link.handle}")
    rows = [[str(h.seq), _when(h.at_unix_ms), h.transition, str(h.fence), h.detail] for h in found.history]
    print(table(rows, ["SEQ", "AT", "TRANSITION", "FENCE", "DETAIL"]))
    return 0


def budget_doc(budget: pb.CarryBudget) -> dict[str, object]:
    """`show --json`'s `carry_budget`: every field, 0s included (0 tenant_budget_bytes: no limit)."""
    return {field.name: getattr(budget, field.name) for field in budget.DESCRIPTOR.fields}


def budget_line(budget: pb.CarryBudget) -> str:
    """What the session's uploads reserve against: its tenant's budget and the cluster's."""
    own = (f"of {budget.tenant_budget_bytes}" if budget.tenant_budget_bytes
           else "(no per-tenant limit)")
    return (f"carry budget: tenant {budget.tenant} {budget.tenant_reserved_bytes} bytes {own}; "
            f"cluster {budget.reserved_bytes} of {budget.budget_bytes} bytes")


def unasked(found: pb.ProbeSessionResponse) -> str:
    """Why a probe gave no reason: no owner to ask (a released record said 'no reason given')."""
    lease = found.record.lease
    if found.verdict != "free" or lease.claim_status in OWNED:
        return "no reason given"
    if not lease.fence:
        return "no owner to ask"
    return f"no owner to ask ({claim_name(lease.claim_status)} at fence {lease.fence})"


async def _probe(args: argparse.Namespace, client: Client) -> int:
    found = await client.probe(args.session)
    if args.json:
        print_json(as_dict(found))
        return reasons.probe_exit(found.verdict)
    print(f"{args.session}: {found.verdict} — {found.reason or found.probe.reason or unasked(found)}")
    if found.HasField("probe"):
        p = found.probe
        outcome = outcome_name(p.outcome)
        print(f"probe answered by {p.answered_by_host_id or '-'}: {outcome}"
              f"{' matched on ' + ','.join(p.matched_on) if p.matched_on else ''}"
              f"{'; tree: ' + p.tree_reason if p.tree_checked else ''}")
    return reasons.probe_exit(found.verdict)


async def _recover(args: argparse.Namespace, client: Client) -> int:
    if not args.yes:
        # Recover releases without stopping anything: on an owner its agent proves alive that is a
        # second writer in waiting, so it is refused unless --yes says that is meant.
        found = await client.probe(args.session)
        owner = found.record.lease.owner
        if found.verdict == "held" and found.record.lease.claim_status in OWNED:
            raise ClientError(Reason.OWNER_ALIVE, f"the owner of {args.session} (host {owner.host_id}, "
                              f"pid {owner.pid}) or its tree is proven alive by its host's agent "
                              f"({found.reason}): recover would release it without stopping it; nothing was "
                              "changed", args.session)
    record = await client.recover(args.session, args.fence, args.reason, args.operator)
    if args.json:
        print_json(as_dict(record))
        return 0
    print(f"{args.session}: fence {args.fence} invalidated; the next grant is at fence "
          f"{max(record.lease.minimum_next_fence, record.lease.fence + 1)}")
    return 0


async def _hosts(args: argparse.Namespace, client: Client) -> int:
    listing = await client.host_listing()
    if args.json:
        print_json(hosts_json(listing))
        return 0
    print(table(host_rows(listing), HOST_HEADER))
    if listing.fence_states:
        print("\n" + table([fence_row(s) for s in listing.fence_states], FENCE_HEADER))
    return 0


def check_options(args: argparse.Namespace, carries: bool) -> None:
    """Exits 2 (usage) for `run` options that do not go together, before anything is made or
    asked: `holdfast codex` and `claude` check them first too (`carries`: they always do)."""
    if args.force and not args.takeover:
        args.parser.error("--force needs --takeover")
    if args.carry_every and not carries:
        args.parser.error("--carry-every needs --carry")
    if args.report and not os.access(os.path.dirname(os.path.abspath(args.report)), os.W_OK):
        # Before any call, like CMD: a caller relying on the report must not be left without one.
        args.parser.error(f"--report {args.report}: its directory does not exist or is not writable")


def _run_handler(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        args.parser.error("run needs a command after --")
    check_options(args, bool(args.carry))
    args.cmd = cmd
    args.outcome = {"error": interrupted()} if getattr(args, "interrupted", False) else {}  # for --report
    code = command(_run)(args)
    if args.report:
        o = args.outcome
        write_report(args.report, run_report(args.session, code, o.get("cmd_status"), o.get("fence", 0),
                                             o.get("error")))
    return code


SESSION_HELP = "the session id: 8 to 128 letters, digits, '_' or '-' (e.g. codex-thread-42)"
RUN_EPILOG = """examples:
  holdfast run --session codex-thread-42 -- codex resume
  holdfast run --session codex-thread-42 --wait 60 -- ./agent.sh      wait up to 60 s for the owner
  holdfast run --session codex-thread-42 --takeover --force -- ./agent.sh

exit status: CMD's own when it ran; when it did not: 75 held or ownership unknown, 69 no
coordinator (or this host's agent not registered), 77 certificates, 2 usage, 127 CMD not found,
126 CMD not executable (checked before anything is asked: the owner is never disturbed), 130
interrupted (Ctrl-C before CMD ran, or before its signals were forwarded: a grant made is released),
143 terminated (SIGTERM before CMD ran, likewise; once CMD runs, SIGTERM is passed on to it).
A CMD may itself exit 75, 69 or 2: --report FILE tells the two apart. It is written (whole, by
rename) when run ends, as one JSON document (docs/json.md; each also has "schema": "holdfast/v1"):
  {"ran": true, "exit_code": 75, "cmd_status": 75, "reason": "", "message": "", "next_step": "",
   "session": "codex-thread-42", "fence": 3}                         CMD ran and exited 75 itself
  {"ran": false, "exit_code": 75, "cmd_status": null, "reason": "HELD", "message": "...",
   "next_step": "...", "session": "codex-thread-42", "fence": 0}     refused: CMD never ran

in a Kubernetes session pod, no certificate is mounted: with HOLDFAST_ENROLL (the issuer, e.g.
holdfast-coordinator.holdfast.svc:7602) set, run enrolls for its own in HOLDFAST_TLS_DIR with the
pod's projected token (HOLDFAST_TOKEN_FILE, default /var/run/secrets/holdfast/token; the issuer's
CA: HOLDFAST_ENROLL_CA), and renews it while it runs (docs/tenants.md, Session pods)."""


def register_run(subparsers: argparse._SubParsersAction) -> None:
    """`run` alone, the parser `holdfast run` builds (holdfast.cli.main): each other command's parser
    is argparse set-up with gettext's lookups on disk, ~1.5 ms of every start for the eight of them."""
    p = subparsers.add_parser("run", parents=[client_options(json=False)],
                              help="run CMD as the session's single writer",
                              usage="holdfast run --session ID [options] -- CMD [ARGS...]",
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=RUN_EPILOG)
    p.add_argument("--session", required=True, type=session_id_arg, metavar="ID", help=SESSION_HELP)
    p.add_argument("--provider", default="", help="provider name recorded with the session")
    p.add_argument("--location", default="", help="where the session's state lives")
    p.add_argument("--takeover", action="store_true", help="ask the current owner to hand the session over")
    p.add_argument("--force", action="store_true",
                   help="with --takeover: if the owner does not let go in time, its host's agent ends it")
    p.add_argument("--handoff-timeout", type=seconds_arg, default=30.0, metavar="S",
                   help="how long a takeover waits for the owner to let go (default 30)")
    p.add_argument("--wait", type=seconds_arg, nargs="?", const=MAX_WAIT_S, metavar="S",
                   help="wait (up to S seconds, default an hour) until the session can be had")
    p.add_argument("--grace", type=seconds_arg, default=10.0, metavar="S",
                   help="SIGTERM to SIGKILL grace when the tree must end (default 10)")
    p.add_argument("--guard", action="append", default=[], type=guard_url, metavar="URL",
                   help="a store of your own to fence too (repeatable): sqlite:///PATH, postgresql://..., "
                   "redis://HOST:PORT/DB or dir:///PATH; its fence marker reaches the new fence before CMD "
                   "runs, so a superseded owner's guarded writes there are refused (docs/guards.md)")
    p.add_argument("--carry", action="append", default=[], metavar="PATH",
                   help="a file or directory that moves with the session (repeatable): the session's last "
                   "copy is restored here before CMD runs, and this run uploads it when it ends "
                   "(docs/carry.md)")
    p.add_argument("--carry-every", type=seconds_arg, metavar="S",
                   help="with --carry: also upload a checkpoint every S seconds while CMD runs")
    p.add_argument("--host-id", help="this host's agent id (default: $HOLDFAST_HOST_ID, else the node name)")
    p.add_argument("--report", metavar="FILE",
                   help="write the outcome as one JSON document to FILE: whether CMD ran, its status, "
                   "and the refusal's reason when it did not (see below)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(handler=_run_handler, parser=p, made_at_grant=[])  # a provider command's sets it


def register(subparsers: argparse._SubParsersAction) -> None:
    register_run(subparsers)
    reader = client_options()
    operator = client_options(role="operator")

    p = subparsers.add_parser("put", parents=[reader], help="fenced write from inside `holdfast run`")
    p.add_argument("key")
    p.add_argument("value", nargs="?", help="the value (default: read stdin)")
    p.add_argument("--grant-file", help="default: $HOLDFAST_GRANT_FILE")
    p.set_defaults(handler=command(_put))

    p = subparsers.add_parser("handle", parents=[reader],
                              help="record the provider's handle (e.g. a thread id) from inside "
                              "`holdfast run`")
    p.add_argument("handle")
    p.add_argument("--grant-file", help="default: $HOLDFAST_GRANT_FILE")
    p.set_defaults(handler=command(_handle))

    p = subparsers.add_parser("get", parents=[reader], help="read a session's fenced data")
    p.add_argument("key")
    p.add_argument("--raw", action="store_true",
                   help="write the value's bytes exactly, without the newline that ends it (e.g. binary)")
    p.add_argument("--session", type=session_id_arg, metavar="ID",
                   help=f"default: $HOLDFAST_SESSION (inside `holdfast run`); {SESSION_HELP}")
    p.set_defaults(handler=command(_get))

    p = subparsers.add_parser("status", parents=[reader], help="hosts (draining ones marked) and sessions")
    p.add_argument("--watch", "-w", action="store_true",
                   help="list the sessions, then print a row at every change (with --json: one JSON "
                   "line per event: listed, changed, deleted) until Ctrl-C")
    p.add_argument("--role", dest="tls_role", choices=("client", "operator"), default="client",
                   help="the certificate to present from --tls-dir: client.pem (default: your tenant's "
                   "sessions) or operator.pem (an all-tenants operator sees every tenant's; docs/tenants.md)")
    p.set_defaults(handler=command(_status))

    p = subparsers.add_parser("show", parents=[reader], help="one session's record and history")
    p.add_argument("session", type=session_id_arg)
    p.set_defaults(handler=command(_show))

    p = subparsers.add_parser("probe", parents=[reader], help="ask the owner's host whether it lives",
                              description="Exit status: 0 free (no owner, or the owner is proven dead: "
                              "the next run is granted), 3 held (the owner is proven alive, or a "
                              "reservation is starting), 4 unknown (neither could be proven, or manual "
                              "recovery); 1 no such session, 69 no coordinator, 77 certificates.")
    p.add_argument("session", type=session_id_arg)
    p.set_defaults(handler=command(_probe))

    p = subparsers.add_parser("recover", parents=[operator],
                              help="operator: invalidate a fence you know is dead (the only way out "
                              "of unknown)")
    p.add_argument("session", type=session_id_arg)
    p.add_argument("--fence", required=True, type=fence_arg,
                   help="the fence you expect (see `holdfast show`)")
    p.add_argument("--reason", required=True, help="why you know the owner is gone (recorded)")
    p.add_argument("--operator", default=default_operator(), help="who is asking (recorded)")
    p.add_argument("--yes", action="store_true",
                   help="recover even when the owner's agent proves it or its tree alive (it keeps running)")
    p.set_defaults(handler=command(_recover))

    p = subparsers.add_parser("hosts", parents=[reader],
                              help="registered hosts, which are draining, and lost hosts' fencing")
    p.set_defaults(handler=command(_hosts))
