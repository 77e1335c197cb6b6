"""The coordinator's refusals: a gRPC status code plus an ErrorInfo reason (docs/design.md §6).

Guarantee: every refusal reaches the client as a status with a machine-readable reason from the
one table of reasons (holdfast.common.reasons), with the status code declared there; a reason
without a wire code cannot be raised. Nothing in here writes anything.
"""

from __future__ import annotations

import grpc

from holdfast.common import reasons
from holdfast.common.reasons import Reason


class CoordinatorError(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.code: grpc.StatusCode = reasons.wire_code(reason)
        self.message = message

    def to_status(self) -> grpc.Status:
        return reasons.status(self.code, self.reason, self.message)
