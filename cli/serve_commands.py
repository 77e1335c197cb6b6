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
from holdfast.common import config, keepalive, tls
from holdfast.common.config import Setting
from holdfast.coordinator import call_limits, fence_rules
from holdfast.coordinator import carry_budget_rules as carry
from holdfast.coordinator.store import DEFAULT_PREFIX, channel_target
from holdfast.coordinator.watch_hub import UNREAD_BUDGET_BYTES

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


def lifetime_hours(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{raw!r} is not a number of hours") from None
    # An hour's floor leaves renewal (at 2/3) 20 minutes of slack; beyond a week it is no longer short.
    if not 0.0 < value <= 168:
        raise ValueError(f"{value} is outside 0..168 hours")
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
            "how often the session, host and carry budget gauges are recounted from etcd", default=15.0),
    Setting("commit_window_seconds", "HOLDFAST_COMMIT_WINDOW_SECONDS", seconds,
            "how long a grant stays reserved for its commit before another caller may supersede it "
            "(it can never run CMD uncommitted)", default=30.0),
    Setting("carry_session_cap_bytes", "HOLDFAST_CARRY_SESSION_CAP_BYTES",
            config.integer_in(1, carry.MAX_SESSION_CAP),
            "largest carried state (`run --carry`) one session may keep", default=carry.DEFAULT_SESSION_CAP),
    Setting("carry_budget_bytes", "HOLDFAST_CARRY_BUDGET_BYTES", config.integer_in(0, 1 << 40),
            "carried state of all sessions together: keep it at most a quarter of etcd's "
            "--quota-backend-bytes "
            "(at its quota etcd refuses every write, heartbeats included)", default=carry.DEFAULT_BUDGET),
    Setting("carry_tenant_budget_bytes", "HOLDFAST_CARRY_TENANT_BUDGET_BYTES", config.integer_in(0, 1 << 40),
            "carried state of one tenant's sessions together, within carry_budget_bytes, so one tenant "
            "cannot spend every other tenant's share; 0: no per-tenant limit",
            default=carry.DEFAULT_TENANT_BUDGET),
    Setting("calls_per_caller_max", "HOLDFAST_CALLS_PER_CALLER_MAX", config.integer_in(1, 1 << 20),
            "streaming or waiting calls (Hold, WatchSessions, Acquire) one caller may keep open on a "
            "replica: one certificate from one address (without TLS the address); past it TOO_MANY_CALLS",
            default=call_limits.PER_CALLER),
    Setting("calls_per_tenant_max", "HOLDFAST_CALLS_PER_TENANT_MAX", config.integer_in(1, 1 << 20),
            "the same for all of one tenant's callers together, so one tenant cannot hold every call "
            "a replica can serve", default=call_limits.PER_TENANT),
    Setting("watch_unread_budget_bytes", "HOLDFAST_WATCH_UNREAD_BUDGET_BYTES",
            config.integer_in(1 << 20, 1 << 40),
            "watch events a replica holds for readers that have not taken them, all watches together: "
            "past it, the watches stalled longest drop theirs and re-list", default=UNREAD_BUDGET_BYTES),
    Setting("default_tenant", "HOLDFAST_DEFAULT_TENANT", config.tenant,
            "tenant of a client certificate that names none, and of sessions recorded before tenants "
            "existed (keep it the same across restarts and replicas)", default="default"),
    Setting("fencers", "HOLDFAST_FENCERS", fence_rules.parse_fencers,
            "fence agents for lost hosts: a list of tables (TOML [[coordinator.fencers]]: hosts, program, "
            "options, secrets; or kind = \"kubernetes-out-of-service\": the Node's out-of-service taint) "
            "or the same as JSON; none: lost hosts wait for an operator", default=()),
    Setting("host_loss_after", "HOLDFAST_HOST_LOSS_AFTER", seconds,
            "seconds a host that sessions name has had no registration before it is fenced (timed on "
            "each replica's monotonic clock; time only triggers a fence, never proves anything)",
            default=60.0),
    Setting("fence_timeout", "HOLDFAST_FENCE_TIMEOUT", seconds,
            "seconds each fence agent action (off, then status) may take before its process group is "
            "killed and the attempt counts as unknown", default=60.0),
    Setting("fence_retry_seconds", "HOLDFAST_FENCE_RETRY_SECONDS", seconds,
            "the first wait after a fence that proved nothing; doubled after each one, up to 10 minutes",
            default=10.0),
    dataclasses.replace(TLS_DIR, help="certificates from `holdfast certs init`: serve mTLS only with "
                        "coordinator.pem, check callers' roles, dial agents with it"),
    Setting("etcd_tls_dir", "HOLDFAST_ETCD_TLS_DIR", config.text,
            "etcd's CA and the coordinator's etcd certificate (default: <tls dir>/etcd)", default=""),
    config.KEEPALIVE,
    Setting("enroll_listen", "HOLDFAST_ENROLL_LISTEN", config.optional_address,
            "also serve holdfast.v1.Enrollment on host:port: server-auth TLS only, signing agent "
            "certificates with <tls dir>/agent-ca.key after checking the caller's projected token with "
            "the API server (needs tls_dir)", default=""),
    Setting("enroll_api_server", "HOLDFAST_ENROLL_API_SERVER", config.text,
            "the Kubernetes API server URL the issuer asks (default: in-cluster configuration)", default=""),
    Setting("enroll_api_ca", "HOLDFAST_ENROLL_API_CA", config.text,
            "with enroll_api_server: the CA file its certificate chains to", default=""),
    Setting("enroll_api_token_file", "HOLDFAST_ENROLL_API_TOKEN_FILE", config.text,
            "with enroll_api_server: the issuer's own bearer token, re-read before each call", default=""),
    Setting("enroll_namespace", "HOLDFAST_ENROLL_NAMESPACE", config.text,
            "holdfast's namespace: only its holdfast-agent service account may enroll (default: this "
            "pod's namespace, else holdfast)", default=""),
    Setting("enroll_lifetime_hours", "HOLDFAST_ENROLL_LIFETIME_HOURS", lifetime_hours,
            "lifetime of an agent certificate the issuer signs (agents renew at two thirds)", default=24.0),
    Setting("session_namespaces", "HOLDFAST_SESSION_NAMESPACES", config.text,
            "namespaces whose pods may enroll for a session certificate (signed with "
            "<tls dir>/session-ca.key): `team-a, team-b=shared` (a namespace is its own tenant, or the one "
            "after =), `*` every other namespace as its own tenant but the issuer's own and one named like "
            "default_tenant or a tenant the table names (docs/tenants.md); empty: none", default=""),
    Setting("session_lifetime_seconds", "HOLDFAST_SESSION_LIFETIME_SECONDS", config.integer_in(10, 86400),
            "lifetime of a session pod's certificate (renewed at two thirds)", default=3600),
    Setting("trust_domain", "HOLDFAST_TRUST_DOMAIN", config.text,
            "the SPIFFE trust domain of session certificates' spiffe://<domain>/ns/<ns>/sa/<sa> names",
            default="cluster.local"),
    *config.logging_settings(),
]


def _serve(raw: argparse.Namespace) -> int:
    from holdfast.common import files, logs
    from holdfast.coordinator import fencers, server
    from holdfast.coordinator.host_fencing import FencingSettings

    try:
        args = config.load(SETTINGS, raw, TABLE)
    except config.ConfigError as exc:
        print(f"holdfast coordinator serve: {exc}", file=sys.stderr)
        return EX_USAGE
    logs.setup(args.log_format, args.log_level)
    keepalive.configure(args.keepalive_seconds)
    etcd_tls = Path(args.etcd_tls_dir) if args.etcd_tls_dir else None
    tls_dir = tls.tls_dir(args.tls_dir)
    try:
        fencers.check_fencers(args.fencers)
        issuer = _issuer(args, tls_dir)
        fencing = FencingSettings(args.fencers, args.host_loss_after, args.fence_timeout,
                                  args.fence_retry_seconds, _node_readers(args.fencers))
        asyncio.run(server.serve(args.etcd, args.listen, args.ready_file, args.prefix,
                                 tls_dir, etcd_tls, args.metrics_listen,
                                 args.census_seconds, args.health_listen, args.commit_window_seconds, issuer,
                                 carry.CarryLimits(args.carry_session_cap_bytes, args.carry_budget_bytes,
                                                   args.carry_tenant_budget_bytes), fencing,
                                 args.default_tenant,
                                 call_limits.CallLimits(args.calls_per_caller_max, args.calls_per_tenant_max),
                                 args.watch_unread_budget_bytes))
    except (ValueError, FileNotFoundError, files.NotPrivate, files.UntrustedLink) as exc:
        # A TLS file refused at start too: one line naming it and the fix, not a traceback a service
        # manager restarts into a loop. Its log is set up: JSON by default.
        logs.fatal(f"holdfast coordinator: {exc}")
        return EX_USAGE
    return 0


def _node_reader(spec: fence_rules.FencerSpec) -> Any:
    """The API client of an out-of-service taint fencer (the issuer's: raw JSON, the same shapes)."""
    from holdfast.enrollment.issuer import KubeApi

    options = dict(spec.options)
    return KubeApi(options.get("api_server", ""), options.get("api_ca", ""),
                   options.get("api_token_file", ""))


def _node_readers(specs: tuple[fence_rules.FencerSpec, ...]) -> Any:
    """None without a taint fencer; else the factory, tried once now so a coordinator that cannot
    reach its API server's configuration (no in-cluster token, a missing CA file) stops at start."""
    kube = [spec for spec in specs if spec.kind == fence_rules.KUBERNETES]
    for spec in kube:
        try:
            _node_reader(spec).close()
        except Exception as exc:  # the client's own configuration errors are not ValueErrors
            raise ValueError(f"setting fencers: the {fence_rules.KUBERNETES} fencer of hosts {spec.hosts!r} "
                             f"has no usable API server configuration: {exc}") from None
    return _node_reader if kube else None


def _issuer(args: argparse.Namespace, tls_dir: Path | None) -> tuple[str, Any] | None:
    if not args.enroll_listen:
        return None
    if tls_dir is None:
        raise ValueError("setting enroll_listen needs tls_dir (the issuer serves with coordinator.pem and "
                         "signs with agent-ca.key)")
    import datetime

    from holdfast.enrollment import issuer as enrollment
    from holdfast.enrollment import session_rules

    namespace = args.enroll_namespace or enrollment.namespace_default()
    policy = session_rules.parse_namespaces(args.session_namespaces, namespace, args.trust_domain,
                                            args.default_tenant)
    sessions = (enrollment.SessionSigning.from_dir(tls_dir, policy,
                                                   datetime.timedelta(seconds=args.session_lifetime_seconds))
                if policy.tenants or policy.any_namespace else None)
    kube = enrollment.KubeApi(args.enroll_api_server, args.enroll_api_ca, args.enroll_api_token_file)
    return args.enroll_listen, enrollment.Issuer.from_dir(
        tls_dir, kube, namespace, datetime.timedelta(hours=args.enroll_lifetime_hours), sessions)


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    group = subparsers.add_parser("coordinator", help="the etcd-backed lease service")
    sub = group.add_subparsers(dest="coordinator_command", required=True)
    p = sub.add_parser("serve", help="serve the Coordinator gRPC API")
    config.add_flags(p, SETTINGS)
    p.add_argument("--ready-file", help="write {\"address\": ...} here once listening")
    p.set_defaults(handler=_serve)
    return sub
