"""The `holdfast` command line: one parser, each command group contributed by the module that owns it.

Exit codes (DESIGN.md §6): CMD's status for `run`; 75 held or unknown (EX_TEMPFAIL); 69 coordinator
unreachable; 77 authentication failure; 2 usage errors.
"""

from __future__ import annotations

import argparse
import sys

from holdfast.agent import commands as agent_commands
from holdfast.coordinator import certs, lifecycle_commands, run_commands, serve_commands, up

EX_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="holdfast", description="At most one live writer per session.")
    sub = parser.add_subparsers(dest="command", required=True)
    agent_commands.register(sub)
    certs.register(sub)
    serve_commands.register(sub)
    run_commands.register(sub)
    lifecycle_commands.register(sub)
    up.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
