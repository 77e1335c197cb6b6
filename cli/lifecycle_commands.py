"""Operator lifecycle commands: `holdfast drain HOST`, `holdfast admin archive|archived|purge-archives|
recover-host|restore-epoch`.

Guarantee: every command is one coordinator RPC (drain then watches its progress, reading only);
`--json` prints one JSON document, errors included; every error names the next step.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from holdfast.cli.options import (
    as_dict,
    client_options,
    command,
    default_operator,
    fence_arg,
    print_json,
    seconds_arg,
    session_id_arg,
)
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.common.reasons import Reason
from holdfast.coordinator import lifecycle_rules


async def _drain(args: argparse.Namespace, client: Client) -> int:
    try:
        reply = await client.drain(args.host, args.operator, draining=not args.undo)
    except ClientError as err:
        if err.reason == Reason.HOST_NOT_REGISTERED:  # the table's next step names run's --host-id
            err.hint = ("check the host id: `holdfast hosts` lists the registered hosts, `holdfast status` "
                        "the hosts sessions name")
        raise
    if not args.json:  # what was done first, then the progress, then what is left
        if reply.draining:
            print(f"host {args.host}: draining (no new grants there); handoff requested for "
                  f"{len(reply.handoff_requested)} sessions")
        else:
            print(f"host {args.host}: no longer draining (grants there again)")
        for line in reply.skipped:
            print(f"  skipped {line}")
    owned = list(reply.still_owned)
    deadline = time.monotonic() + args.wait
    while owned and time.monotonic() < deadline:
        # Progress: the owners let go by themselves (`holdfast run` watches its record); we only read.
        await asyncio.sleep(0.2)
        sessions = await client.list_sessions()
        left = [r.session_id for r in sessions if lifecycle_rules.claimed_on(r, args.host)]
        if not args.json and len(left) != len(owned):
            print(f"drain {args.host}: {len(left)} sessions still held")
        owned = left
    if args.json:
        print_json({"host": args.host, "draining": reply.draining,
                     "handoff_requested": list(reply.handoff_requested), "still_owned": owned,
                     "skipped": list(reply.skipped)})
    elif owned and reply.draining:
        print(f"  still held: {' '.join(owned)}; run `holdfast drain {args.host} --wait 60` again")
    return 0 if not owned or args.undo else 75


async def _archive(args: argparse.Namespace, client: Client) -> int:
    reply = await client.archive(args.session, args.fence, args.operator, args.reason)
    if args.json:
        print_json(as_dict(reply))
    else:
        print(f"{args.session}: archived at fence {reply.record.lease.fence} ({reply.verdict}), "
              f"{reply.history_archived} history entries kept; `holdfast admin archived {args.session}`")
    return 0


async def _archived(args: argparse.Namespace, client: Client) -> int:
    reply = await client.archived(args.session)
    if args.json:
        print_json(as_dict(reply))
    else:
        print(f"{args.session}: archived at fence {reply.record.lease.fence}; "
              f"{reply.record.lease.death_evidence.detail}")
        for h in reply.history:
            print(f"  {h.seq} {h.transition} fence {h.fence} {h.detail}")
    return 0


async def _purge(args: argparse.Namespace, client: Client) -> int:
    reply = await client.purge_archives(int(args.older_than_days * 86400), args.limit)
    if args.json:
        print_json({"purged": list(reply.purged), "more": reply.more})
    else:
        print(f"dropped the archived history of {len(reply.purged)} sessions (their fence floors stay)"
              + ("; more remain: run it again" if reply.more else ""))
    return 0


async def _recover_host(args: argparse.Namespace, client: Client) -> int:
    try:
        reply = await client.recover_host(args.host, args.reason, args.operator)
    except ClientError as err:
        if err.reason == Reason.HOST_LIVE:  # the table's next step is a second agent's, at registration
            err.hint = (f"host {args.host}'s agent is registered, so the host is not gone: drain it "
                        f"(`holdfast drain {args.host}`), or stop its agent and let its registration lapse "
                        "(`holdfast hosts`) before you recover it")
        raise
    failed = [r for r in reply.results if not r.recovered]
    if args.json:
        print_json(as_dict(reply) | {"recovered": len(reply.results) - len(failed), "failed": len(failed)})
    else:
        for r in reply.results:
            print(f"{r.session_id}: fence {r.fence} " + ("invalidated" if r.recovered else f"NOT: {r.error}"))
        print(f"host {args.host}: {len(reply.results) - len(failed)} recovered, {len(failed)} failed")
    return 1 if failed else 0


async def _restore_epoch(args: argparse.Namespace, client: Client) -> int:
    reply = await client.restore_epoch(args.epoch, args.operator, args.reason, args.expect_host)
    # A restored reservation is no open end: Acquire supersedes it on its host's proof of no carrier.
    open_ends = [s for s in reply.sessions if s.outcome in ("conflicted", "unchanged")] + [
        h for h in reply.hosts if h.error or not h.complete or h.orphans_not_stopped]
    if args.json:
        print_json(as_dict(reply))
    else:
        for s in reply.sessions:
            print(f"{s.session_id}: fence {s.old_fence} → floor {s.minimum_next_fence}, "
                  f"{s.outcome} {s.detail}")
        for h in reply.hosts:
            print(f"host {h.host_id}: {h.roots} token roots, stopped {len(h.orphans_stopped)} orphans"
                  f"{'' if h.complete else ' (scan incomplete: orphans may remain)'} {h.error}")
        if open_ends:
            print("open ends above: resolve each, then run `holdfast admin restore-epoch` again")
        print("grants reopened" if reply.grants_reopened else
              "grants stay closed (RESTORE_PENDING) until every host is searched completely or shown off "
              "since the restore (see each host's line)")
    return 1 if open_ends else 0


async def _fence(args: argparse.Namespace, client: Client) -> int:
    reply = await client.fence_host(args.host, args.reason, args.operator)
    attempt = reply.attempt
    if args.json:
        print_json(as_dict(reply))
    else:
        for action in attempt.actions:
            ended = ("timed out" if action.timed_out else f"exit {action.exit_code}" if action.ran
                     else action.error)
            print(f"{attempt.program} action={action.action}: {ended} {action.stdout.strip()}")
        print(f"host {args.host}: {attempt.answer} ({attempt.detail})")
        for r in reply.results:
            print(f"{r.session_id}: fence {r.fence} " + ("freed" if r.recovered else f"NOT: {r.error}"))
    return 0 if attempt.answer == "off" and all(r.recovered for r in reply.results) else 1


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 0 <= days <= 36500:
        raise argparse.ArgumentTypeError("days must be in 0..36500")
    return days


def _epoch(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1 << 40:
        raise argparse.ArgumentTypeError(f"epoch must be an integer in 1..{1 << 40}")
    return int(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    # Every command here presents the operator certificate (docs/design.md §4); purge-archives may
    # present the maintenance one instead (the CronJob's).
    reader = argparse.ArgumentParser(add_help=False, parents=[client_options(role="operator")])
    reader.add_argument("--operator", default=default_operator(), help="who is asking (recorded)")

    p = subparsers.add_parser("drain", parents=[reader],
                              help="hand off every session on HOST and refuse new grants there")
    p.add_argument("host")
    p.add_argument("--wait", type=seconds_arg, default=0.0, metavar="S",
                   help="watch progress up to S seconds")
    p.add_argument("--undo", action="store_true", help="lift the drain: grants on HOST again")
    p.set_defaults(handler=command(_drain))

    admin = subparsers.add_parser("admin", help="operator procedures").add_subparsers(
        dest="admin_command", required=True)
    p = admin.add_parser("archive", parents=[reader], help="archive a session with no owner or reservation")
    p.add_argument("session", type=session_id_arg)
    p.add_argument("--fence", required=True, type=fence_arg, help="the fence you expect (`holdfast show`)")
    p.add_argument("--reason", required=True)
    p.set_defaults(handler=command(_archive))

    p = admin.add_parser("archived", parents=[reader], help="an archived session's record and history")
    p.add_argument("session", type=session_id_arg)
    p.set_defaults(handler=command(_archived))

    p = admin.add_parser("purge-archives", parents=[reader],
                         help="retention: drop archived history older than an age (fence floors stay)")
    p.add_argument("--older-than-days", type=_days, required=True, metavar="D")
    p.add_argument("--limit", type=int, default=100, choices=range(1, 1001), metavar="N",
                   help="at most N sessions per call (1..1000, default 100)")
    p.add_argument("--role", dest="tls_role", choices=("operator", "maintenance"), default="operator",
                   help="the certificate to present from --tls-dir: operator.pem (default) or "
                        "maintenance.pem (retention only: the CronJob's)")
    p.set_defaults(handler=command(_purge))

    p = admin.add_parser("recover-host", parents=[reader],
                         help="operator evidence: HOST is gone for good; free every session it held")
    p.add_argument("host")
    p.add_argument("--reason", required=True, help="why you know the host is gone (recorded)")
    p.set_defaults(handler=command(_recover_host))

    p = admin.add_parser("fence", parents=[reader],
                         help="power HOST off through the coordinator's fencer; on proof, free its sessions")
    p.add_argument("host")
    p.add_argument("--reason", required=True, help="why you fence it (recorded in its evidence)")
    p.set_defaults(handler=command(_fence))

    p = admin.add_parser("restore-epoch", parents=[reader],
                         help="after an etcd snapshot restore: every fence non-live, orphans stopped")
    p.add_argument("--epoch", type=_epoch, default=lifecycle_rules.DEFAULT_EPOCH,
                   help=f"added above every fence (default {lifecycle_rules.DEFAULT_EPOCH})")
    p.add_argument("--expect-host", action="append", default=[], metavar="NODE",
                   help="a node that may run owners (repeatable; e.g. every `kubectl get nodes` name): "
                        "grants stay closed until each was searched")
    p.add_argument("--reason", required=True)
    p.set_defaults(handler=command(_restore_epoch))
