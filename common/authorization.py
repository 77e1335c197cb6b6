"""Authorization by certificate role at a server's edge: the gate both servers put their rule in.

Guarantee: with TLS configured, no handler of the guarded service runs before its rule admitted
the caller's verified role (from the CA-signed certificate, never from a request field); a refusal
is UNAUTHENTICATED (no single holdfast role, or a certificate past its notAfter on a connection
opened before) or PERMISSION_DENIED (the wrong role) with an ErrorInfo
reason, a message naming only the roles involved, and nothing done. A method the rule does not
know is refused: a new RPC stays closed until someone decides who may call it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from holdfast.common import reasons
from holdfast.common.reasons import Reason
from holdfast.common.tls import Role, peer_expired, peer_role


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    reason: Reason
    message: str

    def status(self) -> grpc.Status:
        return reasons.status(self.code, self.reason, self.message)


# (method name, the caller's role or None, the request) -> a refusal, or None to admit.
Rule = Callable[[str, Role | None, object], Refusal | None]


def no_role(method: str) -> Refusal:
    return Refusal(grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED,
                   f"{method}: the client certificate carries no single holdfast role; present one "
                   "issued by `holdfast certs init`")


def expired(method: str) -> Refusal:
    return Refusal(grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED,
                   f"{method}: the client certificate has expired (its connection was opened before); "
                   "renew it (`holdfast certs issue`, or re-enroll the agent) and reconnect")


def wrong_role(method: str, role: Role, wanted: str) -> Refusal:
    return Refusal(grpc.StatusCode.PERMISSION_DENIED, Reason.WRONG_ROLE,
                   f"{method}: a {role.uri()} certificate may not call this; it needs {wanted}")


class RoleGate(grpc.aio.ServerInterceptor):
    """Wraps every method of `service` so its rule runs on the verified peer role first."""

    def __init__(self, service: str, rule: Rule) -> None:
        self.service = service
        self.rule = rule
        # method -> (the handler it guards, the guard): built once per method, not on every call.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        # Health and reflection say nothing about sessions or processes: any certificate of the CA.
        if handler is None or service != self.service:
            return handler
        known = self._guarded.get(method)
        if known is None or known[0] is not handler:
            known = self._guarded[method] = (handler, self._guard(handler, method))
        return known[1]

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        async def check(request: object, context: grpc.aio.ServicerContext) -> None:
            role = peer_role(context)
            # A certificate that lapsed on an open connection has no role: refused as one with none,
            # saying why, before the handler reads or writes anything.
            refusal = expired(method) if role is None and peer_expired(context) else \
                self.rule(method, role, request)
            if refusal is not None:
                await context.abort_with_status(refusal.status())

        codecs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def guarded_unary(request: object, context: grpc.aio.ServicerContext) -> object:
                await check(request, context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(guarded_unary, **codecs)
        if handler.unary_stream is not None:
            stream = handler.unary_stream

            async def guarded_stream(request: object, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
                await check(request, context)
                async for item in stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(guarded_stream, **codecs)
        # No holdfast RPC streams requests; should one appear, it is refused rather than unguarded.
        refusal = Refusal(grpc.StatusCode.PERMISSION_DENIED, Reason.WRONG_ROLE, f"{method}: not authorized")

        async def refuse(request_iterator: object, context: grpc.aio.ServicerContext) -> None:
            await context.abort_with_status(refusal.status())

        return grpc.stream_unary_rpc_method_handler(refuse, **codecs)
