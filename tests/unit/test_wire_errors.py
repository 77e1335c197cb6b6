"""One path for wire errors: every server's status is built by `reasons.status` under one domain,
and code raises and compares `Reason` values, never a reason's spelling (docs/design.md §6)."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from holdfast.common import reasons
from holdfast.common.reasons import DOMAIN, Reason
from holdfast.coordinator.errors import CoordinatorError

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("common", "proc", "agent", "coordinator", "enrollment", "client", "cli", "localstack")
ERRORS = {"CoordinatorError", "ClientError"}


def sources() -> list[tuple[str, ast.Module]]:
    return [(f"{part}/{path.name}", ast.parse(path.read_text(), str(path)))
            for part in PARTS for path in sorted((ROOT / part).glob("*.py"))]


def test_a_status_carries_its_reason_under_the_one_domain() -> None:
    status = CoordinatorError(Reason.HELD, "held by another").to_status()
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION
    (details,) = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    info = error_details_pb2.ErrorInfo()
    assert status_pb2.Status.FromString(details).details[0].Unpack(info)
    assert (info.reason, info.domain) == ("HELD", DOMAIN)


def test_a_clients_own_reason_cannot_be_sent() -> None:
    with pytest.raises(ValueError):
        CoordinatorError(Reason.UNREACHABLE, "never on the wire")
    assert reasons.parse("HELD") is Reason.HELD and reasons.parse("SOMETHING_NEW") == "SOMETHING_NEW"


def test_only_reasons_py_builds_an_error_info() -> None:
    built = [name for name, tree in sources() if name != "common/reasons.py"
             for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "ErrorInfo"]
    assert built == []


def spelled(node: ast.expr) -> bool:
    """A reason's spelling: an upper-case string, or a tuple holding one."""
    if isinstance(node, ast.Tuple):
        return any(spelled(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isupper()


def test_errors_are_raised_and_compared_with_reason_values() -> None:
    wrong = []
    for name, tree in sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ERRORS
                    and node.args and spelled(node.args[0])):
                wrong.append(f"{name}:{node.lineno} {node.func.id}({node.args[0].value!r}")
            if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
                    and node.left.attr == "reason"
                    and any(spelled(c) for c in node.comparators)):
                wrong.append(f"{name}:{node.lineno} compares .reason with a string")
    assert wrong == []
