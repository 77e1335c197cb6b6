"""`holdfast coordinator serve`: run one coordinator replica over an etcd cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from holdfast.agent import tls
from holdfast.agent.commands import add_tls_dir
from holdfast.coordinator.store import DEFAULT_PREFIX

EX_USAGE = 2


def _serve(args: argparse.Namespace) -> int:
    from holdfast.coordinator import server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    etcd_tls = Path(args.etcd_tls_dir) if args.etcd_tls_dir else None
    try:
        asyncio.run(server.serve(args.etcd, args.listen, args.ready_file, args.prefix,
                                 tls.tls_dir(args.tls_dir), etcd_tls))
    except (ValueError, FileNotFoundError) as exc:
        print(f"holdfast coordinator: {exc}", file=sys.stderr)
        return EX_USAGE
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    group = subparsers.add_parser("coordinator", help="the etcd-backed lease service")
    sub = group.add_subparsers(dest="coordinator_command", required=True)
    p = sub.add_parser("serve", help="serve the Coordinator gRPC API")
    p.add_argument("--etcd", required=True, help="etcd client URLs, comma-separated")
    p.add_argument("--listen", required=True, help="host:port (port 0 picks one)")
    p.add_argument("--ready-file", help="write {\"address\": ...} here once listening")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="etcd key prefix")
    add_tls_dir(p, "serve mTLS only with coordinator.pem, check callers' roles, dial agents with it")
    p.add_argument("--etcd-tls-dir", metavar="DIR",
                   help="etcd's CA and the coordinator's etcd certificate (default: <tls dir>/etcd)")
    p.set_defaults(handler=_serve)
    return sub
