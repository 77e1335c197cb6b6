"""The coordinator's refusals: a gRPC status code plus an ErrorInfo reason (docs/design.md §6).

Guarantee: every refusal reaches the client as a status with a machine-readable reason from the
one table of reasons (holdfast.common.reasons), with the status code declared there; a reason
without a wire code cannot be raised. Nothing in here writes anything.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from holdfast.common.reasons import DOMAIN, TABLE, Reason


class CoordinatorError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        code = TABLE[Reason(reason)].code
        if code is None:
            raise ValueError(f"{reason} is a client's own reason, never a coordinator's answer")
        self.reason = reason
        self.code: grpc.StatusCode = code
        self.message = message

    def to_status(self) -> grpc.Status:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN))
        return rpc_status.to_status(
            status_pb2.Status(code=getattr(code_pb2, self.code.name), message=self.message, details=[info])
        )
