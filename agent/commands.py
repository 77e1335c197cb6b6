"""`holdfast agent ...`: the agent's command group. Each subcommand is one parser with a handler;
add a subcommand by adding a function that registers its parser below.
"""

from __future__ import annotations

import argparse
import asyncio

DEFAULT_SPAWN_TOKEN_ENV = "HOLDFAST_SPAWN_TOKEN"


def _serve(args: argparse.Namespace) -> int:
    from holdfast.agent import server, tls

    server.setup_logging()
    tls_dir = tls.tls_dir(args.tls_dir)
    if args.coordinator:
        from holdfast.agent import registration

        asyncio.run(registration.serve_registered(
            lambda ready: server.serve(args.listen, args.host_id, args.spawn_token_env, ready, tls_dir),
            args.ready_file, args.coordinator, args.host_id, args.spawn_token_env, tls_dir))
        return 0
    asyncio.run(server.serve(args.listen, args.host_id, args.spawn_token_env, args.ready_file, tls_dir))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from holdfast.agent import demo

    return demo.run(args.spawn_token_env)


def add_serve(agent_sub: argparse._SubParsersAction) -> None:
    p = agent_sub.add_parser("serve", help="serve the HostAgent gRPC API for this host")
    p.add_argument("--listen", required=True, help="host:port, e.g. 127.0.0.1:7601 (port 0 picks one)")
    p.add_argument("--host-id", required=True, help="this host's id (the node name)")
    p.add_argument("--spawn-token-env", default=DEFAULT_SPAWN_TOKEN_ENV,
                   help="environment variable that carries spawn tokens")
    p.add_argument("--ready-file", help="write {\"address\": ...} here once listening")
    p.add_argument("--coordinator", help="register with this coordinator (host:port) and keep it alive")
    add_tls_dir(p, "serve mTLS only, answering coordinator certificates, and register with "
                "agent-<host id>.pem")
    p.set_defaults(handler=_serve)


def add_tls_dir(parser: argparse.ArgumentParser, what: str) -> None:
    """`--tls-dir`, shared by every command that opens or serves a holdfast gRPC link."""
    parser.add_argument("--tls-dir", metavar="DIR",
                        help=f"certificates from `holdfast certs init` (default: $HOLDFAST_TLS_DIR): {what}")


def add_demo(agent_sub: argparse._SubParsersAction) -> None:
    p = agent_sub.add_parser("demo", help="start an agent, print this host's identity and an attested probe")
    p.add_argument("--spawn-token-env", default=DEFAULT_SPAWN_TOKEN_ENV)
    p.set_defaults(handler=_demo)


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Adds `agent` and returns its sub-subparsers so other modules can add their subcommands."""
    agent = subparsers.add_parser("agent", help="the per-host agent")
    agent_sub = agent.add_subparsers(dest="agent_command", required=True)
    add_serve(agent_sub)
    add_demo(agent_sub)
    return agent_sub
