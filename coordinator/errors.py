"""The coordinator's error model (DESIGN.md §3): a gRPC status code plus an ErrorInfo reason.

Guarantee: every refusal reaches the client as a status with a machine-readable reason; nothing
in here writes anything.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "holdfast.dev"

CODES = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "STALE_FENCE": grpc.StatusCode.FAILED_PRECONDITION,
    "HELD": grpc.StatusCode.FAILED_PRECONDITION,
    "RESERVED": grpc.StatusCode.FAILED_PRECONDITION,
    "OWNERSHIP_UNKNOWN": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_LIVE": grpc.StatusCode.FAILED_PRECONDITION,
    "TREE_ALIVE": grpc.StatusCode.FAILED_PRECONDITION,
    "ATTESTATION_FAILED": grpc.StatusCode.FAILED_PRECONDITION,
    "MANUAL_RECOVERY": grpc.StatusCode.FAILED_PRECONDITION,
    "HOST_NOT_REGISTERED": grpc.StatusCode.FAILED_PRECONDITION,
    "HOST_LIVE": grpc.StatusCode.FAILED_PRECONDITION,
    "HOST_DRAINING": grpc.StatusCode.FAILED_PRECONDITION,
    "RESTORE_PENDING": grpc.StatusCode.FAILED_PRECONDITION,
    "CHAIN_FULL": grpc.StatusCode.FAILED_PRECONDITION,
    "WRONG_CLUSTER": grpc.StatusCode.FAILED_PRECONDITION,  # a grant of another holdfast cluster
    "OPERATION_CONFLICT": grpc.StatusCode.ABORTED,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "FORCE_NOT_ALLOWED": grpc.StatusCode.PERMISSION_DENIED,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
}


class CoordinatorError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = CODES[reason]
        self.message = message

    def to_status(self) -> grpc.Status:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN))
        return rpc_status.to_status(
            status_pb2.Status(code=getattr(code_pb2, self.code.name), message=self.message, details=[info])
        )


def reason_of(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a call's failure, '' when it carries none (client-side helper)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""
