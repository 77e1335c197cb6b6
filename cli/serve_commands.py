"""`holdfast coordinator serve`: run one coordinator replica over an etcd cluster.

Settings come from flags, HOLDFAST_* variables and `--config` (holdfast.common.config, table
`[coordinator]`); a wrong value stops start-up with exit 2 naming the setting.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

from holdfast.cli.agent_commands import TLS_DIR
from holdfast.common import config, tls
from holdfast.common.config import Setting
from holdfast.coordinator.store import DEFAULT_PREFIX, channel_target

EX_USAGE = 2
TABLE = "coordinator"


def etcd_endpoints(raw: Any) -> str:
    value = config.text(raw)
    channel_target(value)  # raises ValueError naming the bad endpoint
    return value


def key_prefix(raw: Any) -> str:
    value = config.text(raw)
    if not value.startswith("/") or not value.endswith("/"):
        raise ValueError(f"{value!r} must start and end with '/'")
    return value


def seconds(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{raw!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise ValueError(f"{value} is outside 0.1..3600 seconds")
    return value


SETTINGS = [
    Setting("etcd", "HOLDFAST_ETCD", etcd_endpoints, "etcd client URLs, comma-separated", required=True),
    Setting("listen", "HOLDFAST_COORDINATOR_LISTEN", config.address, "host:port (port 0 picks one)",
            required=True),
    Setting("prefix", "HOLDFAST_ETCD_PREFIX", key_prefix, "etcd key prefix", default=DEFAULT_PREFIX),
    Setting("metrics_listen", "HOLDFAST_COORDINATOR_METRICS_LISTEN", config.optional_address,
            "serve Prometheus /metrics on host:port", default=""),
    Setting("health_listen", "HOLDFAST_COORDINATOR_HEALTH_LISTEN", config.optional_address,
            "also answer grpc.health.v1, plaintext and nothing else, on host:port (kubelet probes)",
            default=""),
    Setting("census_seconds", "HOLDFAST_CENSUS_SECONDS", seconds,
            "how often the session and host gauges are recounted from etcd", default=15.0),
    Setting("commit_window_seconds", "HOLDFAST_COMMIT_WINDOW_SECONDS", seconds,
            "how long a grant stays reserved for its commit before another caller may supersede it "
            "(it can never run CMD uncommitted)", default=30.0),
    dataclasses.replace(TLS_DIR, help="certificates from `holdfast certs init`: serve mTLS only with "
                        "coordinator.pem, check callers' roles, dial agents with it"),
    Setting("etcd_tls_dir", "HOLDFAST_ETCD_TLS_DIR", config.text,
            "etcd's CA and the coordinator's etcd certificate (default: <tls dir>/etcd)", default=""),
    *config.logging_settings(),
]


def _serve(raw: argparse.Namespace) -> int:
    from holdfast.common import logs
    from holdfast.coordinator import server

    try:
        args = config.load(SETTINGS, raw, TABLE)
    except config.ConfigError as exc:
        print(f"holdfast coordinator serve: {exc}", file=sys.stderr)
        return EX_USAGE
    logs.setup(args.log_format, args.log_level)
    etcd_tls = Path(args.etcd_tls_dir) if args.etcd_tls_dir else None
    try:
        asyncio.run(server.serve(args.etcd, args.listen, args.ready_file, args.prefix,
                                 tls.tls_dir(args.tls_dir), etcd_tls, args.metrics_listen,
                                 args.census_seconds, args.health_listen, args.commit_window_seconds))
    except (ValueError, FileNotFoundError) as exc:
        print(f"holdfast coordinator: {exc}", file=sys.stderr)
        return EX_USAGE
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    group = subparsers.add_parser("coordinator", help="the etcd-backed lease service")
    sub = group.add_subparsers(dest="coordinator_command", required=True)
    p = sub.add_parser("serve", help="serve the Coordinator gRPC API")
    config.add_flags(p, SETTINGS)
    p.add_argument("--ready-file", help="write {\"address\": ...} here once listening")
    p.set_defaults(handler=_serve)
    return sub
