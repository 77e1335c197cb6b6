"""`holdfast agent ...`: the agent's command group. Each subcommand is one parser with a handler;
add a subcommand by adding a function that registers its parser below.

Server settings come from flags, HOLDFAST_* variables and `--config` (agent/config.py, table
`[agent]`); a wrong value stops start-up with exit 2 naming the setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Coroutine

from holdfast.common import config, env, spawn_tokens
from holdfast.common.config import Setting
from holdfast.common.reasons import EX_NOPERM

DEFAULT_SPAWN_TOKEN_ENV = spawn_tokens.DEFAULT_VARIABLE
EX_USAGE = 2
TABLE = "agent"

COORDINATOR = Setting("coordinator", env.COORDINATOR, config.optional_address,
                      "register with this coordinator (host:port) and keep it alive", default="")
REGISTRATION_TTL = Setting(
    "registration_ttl", "HOLDFAST_REGISTRATION_TTL", config.integer_in(2, 60), "seconds a registration "
    "outlives this agent's last heartbeat (one every third of it): a dead node's sessions become "
    "recoverable (`admin recover-host`) that much sooner; too short, and a stalled agent re-registers",
    default=10)
TLS_DIR = Setting("tls_dir", env.TLS_DIR, config.text, "certificates from `holdfast certs init`: "
                  "serve mTLS only, answering coordinator certificates, and register with "
                  "agent-<host id>.pem", default="")
NODE = Setting("node", "HOLDFAST_NODE", config.boolean, "this agent answers for a node: refuse to serve "
               "unless in the init PID namespace", default=False, boolean=True)
NODE_CGROUP_NS = Setting(
    "node_cgroup_namespace", "HOLDFAST_NODE_CGROUP_NAMESPACE", config.boolean, "join the cgroup namespace "
    "of PID 1 (the node's, with hostPID) before serving: a pod's private one cannot address or move "
    "other pods' processes (needs CAP_SYS_ADMIN)", default=False, boolean=True)
SERVE_SETTINGS = [
    Setting("listen", "HOLDFAST_AGENT_LISTEN", config.address,
            "host:port, e.g. 127.0.0.1:7601 (port 0 picks one)", required=True),
    Setting("host_id", env.HOST_ID, config.host_id, "this host's id (the node name)", required=True),
    Setting("spawn_token_env", spawn_tokens.VARIABLE_ENV, config.env_name,
            "environment variable that carries spawn tokens", default=DEFAULT_SPAWN_TOKEN_ENV),
    COORDINATOR,
    REGISTRATION_TTL,
    NODE,
    NODE_CGROUP_NS,
    Setting("metrics_listen", "HOLDFAST_AGENT_METRICS_LISTEN", config.optional_address,
            "serve Prometheus /metrics on host:port", default=""),
    Setting("advertise", "HOLDFAST_AGENT_ADVERTISE", config.optional_address,
            "register this host:port instead of the bound address (a proxy or NAT in front, or a "
            "wildcard listen)", default=""),
    Setting("health_listen", "HOLDFAST_AGENT_HEALTH_LISTEN", config.optional_address,
            "also answer grpc.health.v1, plaintext and nothing else, on host:port (kubelet probes)",
            default=""),
    TLS_DIR,
    config.KEEPALIVE,
    Setting("enroll", "HOLDFAST_ENROLL", config.optional_address,
            "get (and renew) this node's certificate from the enrollment listener at host:port "
            "(`coordinator serve --enroll-listen`) with the pod's projected token; needs --tls-dir",
            default=""),
    Setting("enroll_ca", "HOLDFAST_ENROLL_CA", config.text,
            "the CA the enrollment listener's certificate chains to (default: <tls dir>/ca.pem)", default=""),
    Setting("enroll_server_name", "HOLDFAST_ENROLL_SERVER_NAME", config.text,
            "the name the enrollment listener's certificate carries, when not the --enroll host "
            "(e.g. holdfast-coordinator)", default=""),
    Setting("token_file", "HOLDFAST_TOKEN_FILE", config.text,
            "the projected ServiceAccount token (audience holdfast) sent with --enroll",
            default="/var/run/secrets/holdfast/token"),
    *config.logging_settings(),
]
DOCTOR_SETTINGS = [COORDINATOR, NODE, NODE_CGROUP_NS, TLS_DIR,
                   Setting("host_id", env.HOST_ID, config.host_id, "with --tls-dir: present "
                           "agent-<host id>.pem to the coordinator", default="")]


def load(settings: list[Setting], args: argparse.Namespace) -> argparse.Namespace:
    """The resolved settings, or exit 2 with the message naming the wrong one."""
    try:
        return config.load(settings, args, TABLE)
    except config.ConfigError as exc:
        print(f"holdfast agent {args.agent_command}: {exc}", file=sys.stderr)
        raise SystemExit(EX_USAGE) from None


def _serve(raw: argparse.Namespace) -> int:
    from holdfast.agent import doctor, hostinfo, server
    from holdfast.common import keepalive, logs, tls
    from holdfast.proc import cgroups

    args = load(SERVE_SETTINGS, raw)
    keepalive.configure(args.keepalive_seconds)
    tls_dir = tls.tls_dir(args.tls_dir)
    logs.setup(args.log_format, args.log_level)
    if why := hostinfo.refusal():
        # Start times read in another clock, or a machine id two machines share, prove live owners dead.
        logs.fatal(f"holdfast agent serve: refusing to serve probes: {why}")
        return EX_USAGE
    if args.node and not doctor.in_init_pid_ns():
        # A pod without hostPID numbers pids in its own namespace: its probes would judge strangers.
        logs.fatal("holdfast agent serve: setting node is on but this process is not in the init PID "
                   "namespace; refusing to serve probes. Next: run with hostPID: true, or without --node off "
                   "a node")
        return EX_USAGE
    if args.node_cgroup_namespace and (why := cgroups.join_node_namespace()):
        logs.fatal(f"holdfast agent serve: cannot join the node's cgroup namespace: {why}. Next: give the "
                   "agent CAP_SYS_ADMIN and hostPID, or run it without --node-cgroup-namespace (then its "
                   "trees' end rests on the token scan alone)")
        return EX_USAGE

    enroller = None
    if args.enroll:
        from pathlib import Path

        from holdfast.agent import enroll, rotation

        if tls_dir is None:
            print("holdfast agent serve: setting enroll needs tls_dir (where the key and certificate go). "
                  "Next: pass --tls-dir", file=sys.stderr)
            return EX_USAGE
        server_ca = Path(args.enroll_ca) if args.enroll_ca else tls_dir / "ca.pem"
        enroller = rotation.Enroller(args.enroll, server_ca, args.host_id, Path(args.token_file), tls_dir,
                                     args.enroll_server_name)
        try:
            asyncio.run(rotation.ensure_waiting(enroller))
        except (enroll.EnrollmentFailed, OSError) as exc:
            print(f"holdfast agent serve: enrollment with {args.enroll} failed: {exc}. Next: check the "
                  "issuer's log (`enrollment refused` names the reason) and docs/operations.md, "
                  "Certificates", file=sys.stderr)
            return EX_NOPERM

    def serve(bound: asyncio.Future[str] | None = None) -> Coroutine[object, object, None]:
        return server.serve(args.listen, args.host_id, args.spawn_token_env, args.ready_file, tls_dir,
                            args.metrics_listen, args.health_listen, enroller, bound)

    from holdfast.common import files

    try:
        if args.coordinator:
            from holdfast.agent import registration

            asyncio.run(registration.serve_registered(
                serve, args.coordinator, args.host_id, args.spawn_token_env, tls_dir, args.advertise,
                args.registration_ttl))
        else:
            asyncio.run(serve())
    except (files.NotPrivate, files.UntrustedLink) as exc:
        # A key or certificate refused at start (another's, others may read it, a link): one line
        # naming it and the fix, not a traceback a service manager restarts into a loop.
        logs.fatal(f"holdfast agent serve: {exc}")
        return EX_USAGE
    return 0


def _doctor(raw: argparse.Namespace) -> int:
    from holdfast.agent import doctor
    from holdfast.common import tls
    from holdfast.proc import cgroups

    args = load(DOCTOR_SETTINGS, raw)
    tls_dir = tls.tls_dir(args.tls_dir)
    # An exec'd readiness probe starts in the pod's namespaces: it checks the view the agent serves from.
    cgroup_ns_error = cgroups.join_node_namespace() if args.node_cgroup_namespace else ""
    if tls_dir is not None and not args.host_id:
        print("holdfast agent doctor: setting host_id is required with tls_dir (the certificate is "
              "agent-<host id>.pem). Next: pass --host-id or set HOLDFAST_HOST_ID", file=sys.stderr)
        return EX_USAGE
    facts = doctor.gather(args.node, args.coordinator, tls_dir, args.host_id, cgroup_ns_error)
    checks = doctor.run_checks(facts)
    print(json.dumps(doctor.as_json(checks)) if args.json else doctor.render_text(checks))
    return 0 if doctor.healthy(checks) else 1


def _demo(args: argparse.Namespace) -> int:
    from holdfast.agent import demo

    return demo.run(args.spawn_token_env)


def add_serve(agent_sub: argparse._SubParsersAction) -> None:
    p = agent_sub.add_parser("serve", help="serve the HostAgent gRPC API for this host")
    config.add_flags(p, SERVE_SETTINGS)
    p.add_argument("--ready-file", help="write {\"address\": ...} here once listening")
    p.set_defaults(handler=_serve)


def add_doctor(agent_sub: argparse._SubParsersAction) -> None:
    p = agent_sub.add_parser("doctor", help="check that this host lets the agent prove life and death "
                             "(exit 0 only when every check passes)")
    config.add_flags(p, DOCTOR_SETTINGS)
    p.add_argument("--json", action="store_true", help="one JSON object: ok and every check")
    p.set_defaults(handler=_doctor)


def add_demo(agent_sub: argparse._SubParsersAction) -> None:
    p = agent_sub.add_parser("demo", help="start an agent, print this host's identity and an attested probe")
    p.add_argument("--spawn-token-env", default=DEFAULT_SPAWN_TOKEN_ENV)
    p.set_defaults(handler=_demo)


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Adds `agent` and returns its sub-subparsers so other modules can add their subcommands."""
    agent = subparsers.add_parser("agent", help="the per-host agent")
    agent_sub = agent.add_subparsers(dest="agent_command", required=True)
    add_serve(agent_sub)
    add_doctor(agent_sub)
    add_demo(agent_sub)
    return agent_sub
