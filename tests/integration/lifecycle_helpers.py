"""Helpers for the lifecycle tests: CLI calls against a real coordinator and grants captured from
real `holdfast run` children."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc

from holdfast.client.grant import Grant
from holdfast.common.reasons import reason_of
from holdfast.v1 import coordinator_pb2 as pb
from holdfast.v1 import coordinator_pb2_grpc


def cli(address: str, *argv: str, timeout: float = 120) -> tuple[int, dict]:  # type: ignore[type-arg]
    """`holdfast ARGV --json --coordinator ADDRESS`: (exit code, the one JSON document)."""
    done = subprocess.run([sys.executable, "-m", "holdfast.cli", *argv, "--json",
                           "--coordinator", address], capture_output=True, timeout=timeout, check=False)
    return done.returncode, json.loads(done.stdout or b"{}")


def grant_copier(path: Path, seconds: int = 300) -> list[str]:
    """A CMD that copies its grant file to `path` and then runs as the session's tree."""
    copy = f'cp "$HOLDFAST_GRANT_FILE" {path}.tmp && mv {path}.tmp {path}'
    return ["sh", "-c", f"{copy} && exec sleep {seconds}"]


def fenced_put_reason(stub: coordinator_pb2_grpc.CoordinatorStub, grant: Grant, key: str) -> str:
    """'' when the write landed, else the refusal's reason."""
    try:
        stub.FencedPut(pb.FencedPutRequest(session_id=grant.session_id, fence=grant.fence,
                                           secret=grant.secret, key=key, value=b"v"), timeout=10)
    except grpc.RpcError as exc:
        return reason_of(exc) or exc.code().name  # type: ignore[arg-type, attr-defined]
    return ""
