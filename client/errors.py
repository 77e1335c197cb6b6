"""What a failed call means to the caller: one ClientError, with the reason, exit code and next step
of the one table of reasons (holdfast.common.reasons), raised as the subclass of its reason's family
(SessionHeld, OwnershipUnknown, StaleFence, PermissionDenied, Unavailable, BadInput).

Guarantee: `ClientError(reason, ...)` is always an instance of its reason's family class (the table's
`family` column), so code that raises a ClientError raises the typed one and code that catches
ClientError catches them all. A call nobody answered is UNREACHABLE (nothing listens, or no answer in time) or
TLS_HANDSHAKE_FAILED (a certificate problem, never retried), never a refusal; only UNAVAILABLE
without a failed handshake is transient: nothing was written, or the coordinator's transaction went
unanswered and may have landed, so only calls safe to repeat retry it (holdfast.client.connection).
"""

from __future__ import annotations

from typing import ClassVar

import grpc

from holdfast.common import reasons
from holdfast.common.reasons import Reason, parse, reason_of


class ClientError(Exception):
    """A refusal or failure with its reason, exit code and next step. Constructed with a reason of a
    family, it is that family's subclass; a reason of none (or one this client does not know) is a
    plain ClientError.
    """

    family: ClassVar[reasons.Family] = reasons.Family.NONE

    def __new__(cls, reason: Reason | str, message: str, session: str = "") -> ClientError:
        chosen = FAMILIES.get(reasons.family(reason), cls) if cls is ClientError else cls
        return super().__new__(chosen)

    def __init__(self, reason: Reason | str, message: str, session: str = "") -> None:
        """`reason`: one of the table's, or a reason as a peer sent it that this client does not
        know (`reasons.parse`), shown as sent with the UNKNOWN meaning."""
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.session = session
        self.retried = False  # set when an earlier try of the same call may have landed
        self.fence = 0  # the session's current fence, when known: the next step names it
        self.hint = ""  # a next step that fits what the caller already tried, instead of the table's

    @property
    def exit_code(self) -> int:
        """What `holdfast` exits with for this reason (75 held or unknown, 69 unavailable, ...)."""
        return reasons.exit_code(self.reason)

    @property
    def next_step(self) -> str:
        """What to do about it, fitted to what the caller tried when it is known."""
        return self.hint or reasons.next_step(self.reason, self.session, self.fence)

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}. Next: {self.next_step}"


class SessionHeld(ClientError):
    """A live owner has the session, or one is starting or ending (HELD, RESERVED, OPERATION_CONFLICT,
    RELEASE_PENDING, TREE_ALIVE, OWNER_ALIVE): `wait=` or `takeover=` may get it."""

    family = reasons.Family.HELD


class OwnershipUnknown(ClientError):
    """Whether the owner lives is not proven either way (OWNERSHIP_UNKNOWN, MANUAL_RECOVERY): nothing
    is granted on a guess; `holdfast probe` says why, `holdfast recover` decides."""

    family = reasons.Family.UNKNOWN


class StaleFence(ClientError):
    """This grant no longer writes (STALE_FENCE, NOT_LIVE): the session moved to a newer fence (a
    takeover) or its owner let go. Nothing was written."""

    family = reasons.Family.STALE


class PermissionDenied(ClientError):
    """Certificates, roles, tenants or the grant's secret refuse the call (PERMISSION_DENIED,
    FORCE_NOT_ALLOWED, WRONG_TENANT, UNAUTHENTICATED, WRONG_ROLE, TLS_*, ENROLLMENT_REFUSED)."""

    family = reasons.Family.PERMISSION


class Unavailable(ClientError):
    """The coordinator, this host's agent or a guarded store cannot serve now (UNAVAILABLE, UNREACHABLE,
    HOST_NOT_REGISTERED, WRONG_CLUSTER, ATTESTATION_FAILED, HOST_DRAINING, ...): retry later."""

    family = reasons.Family.UNAVAILABLE


class BadInput(ClientError):
    """The caller's own argument (INVALID_ARGUMENT, CMD_NOT_FOUND, CMD_NOT_EXECUTABLE, NOT_FOUND,
    CARRY_TOO_LARGE): retrying the same call will not help."""

    family = reasons.Family.BAD_INPUT


FAMILIES: dict[reasons.Family, type[ClientError]] = {
    kind.family: kind for kind in (SessionHeld, OwnershipUnknown, StaleFence, PermissionDenied, Unavailable,
                                   BadInput)}


def _unanswered(exc: BaseException, *marks: str) -> bool:
    """A call no coordinator answered (no ErrorInfo), whose transport error mentions one of `marks`."""
    if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    if reason_of(exc):
        return False
    details = (exc.details() or "").lower()
    return any(mark in details for mark in marks)


def handshake_failed(exc: BaseException) -> bool:
    return _unanswered(exc, "handshake failed")


def refused(exc: BaseException) -> bool:
    return _unanswered(exc, "connection refused")


def classify(exc: grpc.aio.AioRpcError, session: str, address: str, plaintext: bool = False) -> ClientError:
    reason = reason_of(exc)
    if not reason:
        code = exc.code()
        if handshake_failed(exc):
            # Not UNREACHABLE: a wrong CA (or TLS to a plaintext coordinator) is not "no coordinator".
            # gRPC's text ends with OpenSSL's own words, e.g. "...: certificate signature failure: OK".
            words = (exc.details() or "").removesuffix(": OK").rsplit(": ", 1)[-1][:200]
            return ClientError(Reason.TLS_HANDSHAKE_FAILED, f"the TLS handshake with {address} failed "
                               f"({words})", session)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            why = "nothing listens there" if refused(exc) else code.name
            if plaintext and _unanswered(exc, "socket closed"):
                why = "it closed the connection, as a TLS-only coordinator does to plaintext: pass --tls-dir"
            return ClientError(Reason.UNREACHABLE, f"no answer from the coordinator at {address} "
                               f"({why})", session)
        reason = code.name
    return ClientError(parse(reason), exc.details() or reason, session)


def transient(exc: BaseException) -> bool:
    # UNAVAILABLE is both "no coordinator" and "the coordinator cannot reach etcd": nothing was written,
    # or a transaction went unanswered and may have landed, which only calls safe to repeat retry.
    # A failed handshake is the certificates', and does not heal by retrying.
    return (isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE
            and not handshake_failed(exc))
