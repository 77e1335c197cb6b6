"""What every `holdfast` command that talks to a coordinator shares: its options (--coordinator,
--tls-dir and the role it presents, --json), argument types that refuse bad input before any call,
and the one way a ClientError becomes output and an exit code.

Guarantee: with `--json` a command prints one JSON document, its error included; every error
names the next step (from holdfast.common.reasons) and exits with that reason's code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from holdfast.client.acquire import MAX_WAIT_S
from holdfast.client.connection import Client, local_host_id
from holdfast.client.errors import ClientError
from holdfast.common import env, identifiers, tls, upstate
from holdfast.common.reasons import Reason
from holdfast.common.version import JSON_SCHEMA

if TYPE_CHECKING:
    from holdfast.client.enrollment import Enroller


def default_operator() -> str:
    """Who is asking, for the record: user@host. A uid with no passwd entry (the image's 65532)
    makes getpass raise KeyError, which at parser build time would stop every command."""
    import getpass  # termios and pwd: `run` records no operator, and they cost its start ~0.3 ms

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid-{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def session_id_arg(text: str) -> str:
    try:
        return identifiers.check_session_id(text)
    except identifiers.InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def guard_url(text: str) -> str:
    from holdfast.client import guards  # only a --guard given loads the stores' module (~0.4 ms)

    try:
        return guards.check_url(text)
    except guards.GuardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"seconds must be in 0..{MAX_WAIT_S:g}")
    return value


def fence_arg(text: str) -> int:
    try:
        return identifiers.check_fence(int(text))
    except (ValueError, identifiers.InvalidInput):
        raise argparse.ArgumentTypeError(f"fence must be an integer in 1..{identifiers.MAX_FENCE}") from None


# 64-bit identifiers that may exceed 2**53, past which a JSON reader's number (a double) drops
# digits: they stay strings. Every other integer is a count, a time, a fence, a pid or a sequence
# number, always below it, and is a number.
STRING_INTEGERS = frozenset({"lease_id", "inode", "pidfd_ino"})


def _numbers(descriptor: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` (MessageToDict's, of a message of `descriptor`) with its 64-bit integers as numbers
    (the proto3 JSON mapping writes them as strings), but STRING_INTEGERS."""
    from google.protobuf.descriptor import FieldDescriptor as F

    wide = (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64)
    for field in descriptor.fields:
        if field.name not in doc:
            continue
        repeated = field.is_repeated
        values = doc[field.name] if repeated else [doc[field.name]]
        if field.message_type is not None and not field.message_type.full_name.startswith("google."):
            for value in values:
                _numbers(field.message_type, value)
        elif field.type in wide and field.name not in STRING_INTEGERS:
            numbers = [int(value) for value in values]
            doc[field.name] = numbers if repeated else numbers[0]
    return doc


def as_dict(message: Message) -> dict[str, Any]:
    # Imported here: only --json and a few reports need it, and it costs a `run` a tenth of its
    # start (docs/benchmarks.md).
    from google.protobuf.json_format import MessageToDict

    return _numbers(message.DESCRIPTOR, MessageToDict(message, preserving_proto_field_name=True))


def schema(document: dict[str, Any]) -> dict[str, Any]:
    """A `--json` document (or `run --report`'s, or one `status --watch --json` line) with its schema."""
    return {"schema": JSON_SCHEMA, **document}


Body = Callable[[argparse.Namespace, Client], Awaitable[int]]


def command(body: Body) -> Callable[[argparse.Namespace], int]:
    """Runs one command against the coordinator; a ClientError becomes its exit code and next step."""

    def handler(args: argparse.Namespace) -> int:
        if getattr(args, "interrupted", False):  # Ctrl-C while it was loading: nothing asked
            return failed(args, interrupted())

        async def main() -> int:
            role = getattr(args, "tls_role", "client")
            enroller = session_enroller(args) if role == "client" else None
            if enroller is not None:
                await enroller.ensure()
            async with Client(args.coordinator, getattr(args, "host_id", None), args.tls_dir, role,
                              enroller) as client:
                return await body(args, client)

        try:
            return asyncio.run(main())
        except ClientError as err:
            return failed(args, err)
        except KeyboardInterrupt:  # Ctrl-C: asyncio.run cancelled the command, which cleaned up
            return failed(args, interrupted())

    return handler


def session_enroller(args: argparse.Namespace) -> Enroller | None:
    """A session pod's enrollment when HOLDFAST_ENROLL asks for one (holdfast.client.enrollment):
    the runtime's certificate is its own, from the issuer, not a mounted secret."""
    if not os.environ.get(env.ENROLL):
        return None
    from holdfast.client.enrollment import Enroller  # x509: only an enrolling pod pays for it

    return Enroller.from_env(tls.tls_dir(args.tls_dir), local_host_id(getattr(args, "host_id", None)))


def interrupted() -> ClientError:
    return ClientError(Reason.INTERRUPTED, "interrupted (Ctrl-C)")


def terminated() -> ClientError:
    return ClientError(Reason.TERMINATED, "terminated (SIGTERM) before CMD ran")


def failed(args: argparse.Namespace, err: ClientError) -> int:
    """A command's failure as its output (one line on stderr, and the error document with --json)
    and its exit code."""
    if getattr(args, "json", False):
        print(json.dumps(schema({"error": {"reason": err.reason, "message": err.message,
                                           "next_step": err.next_step}})))
    print(f"holdfast: {err}", file=sys.stderr)
    return err.exit_code


def print_json(value: dict[str, Any]) -> None:
    print(json.dumps(schema(value), indent=2, sort_keys=True))


def add_tls_dir(parser: argparse.ArgumentParser, what: str) -> None:
    """`--tls-dir` for the client commands that open a holdfast gRPC link (servers take TLS_DIR)."""
    parser.add_argument("--tls-dir", metavar="DIR",
                        help=f"certificates from `holdfast certs init` (default: $HOLDFAST_TLS_DIR): {what}")


def client_options(*, json: bool = True, role: str = "client") -> argparse.ArgumentParser:
    """The parent parser of every command that calls a coordinator: --coordinator and --tls-dir,
    and --json unless the command only acts. `role` is the certificate it presents: `client` for a
    runtime's and the read commands, `operator` for the commands that override evidence."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--coordinator", help="host:port (default: $HOLDFAST_COORDINATOR, else "
                         f"{upstate.DEFAULT_COORDINATOR}, where `holdfast up` listens)")
    add_tls_dir(options, f"present {role}.pem; without it, and when a `holdfast up --tls` runs the "
                "coordinator, its certificates")
    options.set_defaults(tls_role=role)
    if json:
        options.add_argument("--json", action="store_true", help="print one JSON document")
    return options
