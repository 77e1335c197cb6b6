"""How a holdfast gRPC server comes up and goes down, shared by the agent and the coordinator.

Guarantee: the ready file names the real bound address (a supervisor asking for port 0 learns the
port) and appears only after the server accepts calls, written whole by rename into its directory,
opened once through no link another user made or could swap (a server refusing one exits); on
SIGTERM or SIGINT health turns NOT_SERVING first, then in-flight calls drain within the grace
period. With `--metrics-listen` the Prometheus endpoint is bound before the ready file names it.
With `--health-listen` a second, plaintext port answers grpc.health.v1 and nothing else: kubelet
gRPC probes cannot present a client certificate, and a health status is no secret. Every port is
bound exclusively (no SO_REUSEPORT); a taken one stops the server at once, naming the holder where
it can. Under a service manager that asks (NOTIFY_SOCKET: the Type=notify units of deploy/systemd),
READY=1 is sent after the ready file is written and SIGTERM handled, and STOPPING=1 when the drain
begins. Every connection is closed at a maximum age (an hour by default), so a client certificate that
has expired or lost its CA's trust stops at the latest then even on a stream (common/tls.py refuses
its next call at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from holdfast.common import files, keepalive, listeners


@dataclass
class Serving:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    address: str
    health_server: grpc.aio.Server | None = None
    health_address: str = ""


# gRPC turns SO_REUSEPORT on by default: a second server on a taken port then binds beside the
# first and the kernel spreads connections over both: two coordinators over two etcds would answer
# one address. Every holdfast server binds exclusively.
SERVER_OPTIONS: tuple[tuple[str, object], ...] = (("grpc.so_reuseport", 0),)
# gRPC checks a client certificate's validity only at the handshake, and keepalive holds a connection
# open for ever: every connection is sent GOAWAY at this age (gRPC jitters it by 10%), its open calls
# (a Hold, a WatchSessions, a WatchExits) given the grace below to end, so each caller handshakes
# again with the certificate it has now. An hour: the default session_lifetime_seconds, the shortest
# lifetime holdfast issues by default. Clients reconnect their watches on the UNAVAILABLE it ends in.
MAX_AGE_ENV = "HOLDFAST_MAX_CONNECTION_AGE_SECONDS"
MAX_AGE_GRACE_ENV = "HOLDFAST_MAX_CONNECTION_AGE_GRACE_SECONDS"
DEFAULT_MAX_AGE_SECONDS, DEFAULT_MAX_AGE_GRACE_SECONDS = 3600, 30


def connection_age_options() -> list[tuple[str, object]]:
    """$HOLDFAST_MAX_CONNECTION_AGE_SECONDS and its _GRACE_ one (1..86400 each), else the defaults."""
    age = keepalive.env_seconds(MAX_AGE_ENV, DEFAULT_MAX_AGE_SECONDS, 1, 86400)
    grace = keepalive.env_seconds(MAX_AGE_GRACE_ENV, DEFAULT_MAX_AGE_GRACE_SECONDS, 1, 86400)
    return [("grpc.max_connection_age_ms", age * 1000), ("grpc.max_connection_age_grace_ms", grace * 1000)]


def new_server(interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
               options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Server:
    return grpc.aio.server(interceptors=list(interceptors), options=[
        *SERVER_OPTIONS, *keepalive.server_options(), *connection_age_options(), *options])


class Unregistered:
    """What a service's generated `add_*_to_server` is handed instead of the server: the service's
    generic handler (every method, found by name) is added, and no method is registered with gRPC's
    core. grpc.aio's server keeps one request pending per registered method and waits on all of
    them afresh for every call (an `asyncio.wait` over each server's ~12 pending requests, twice
    per call: ~50 µs of the agent's CPU per cycle of two calls); unregistered, every call arrives
    through its single pending request for unregistered methods. What a call is served by does not
    change: the same handlers, looked up by the same full method name."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        """Nothing: the generated code added these very handlers as its generic handler first."""


def _cannot_listen(listen: str, setting: str, why: str) -> SystemExit:
    return SystemExit(f"cannot listen on {listen} ({setting}): {why}. Next: stop what holds it, or choose "
                      f"another --{setting.replace('_', '-')}")


def _bind(server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None,
          setting: str) -> str:
    # Asked first with a plain socket so the usual case (port taken) is one line naming the holder,
    # not gRPC's own log lines; gRPC's exclusive bind below still decides, e.g. after a race.
    if why := listeners.bind_error(listen):
        raise _cannot_listen(listen, setting, why)
    try:
        port = (server.add_secure_port(listen, credentials) if credentials
                else server.add_insecure_port(listen))
    except RuntimeError:  # grpcio >= 1.60 raises where older ones returned 0
        port = 0
    if port == 0:
        raise _cannot_listen(listen, setting, listeners.bind_error(listen) or
                             "is the address on this machine and the port free?")
    return f"{listen.rsplit(':', 1)[0]}:{port}"


async def start(listen: str, service_name: str, add_service: Callable[[Unregistered], object],
                credentials: grpc.ServerCredentials | None = None,
                interceptors: Sequence[grpc.aio.ServerInterceptor] = (), health_listen: str = "",
                options: Sequence[tuple[str, object]] = ()) -> Serving:
    """With `credentials` the main port is TLS only: plaintext is never also accepted there. The
    health port (when asked for) shares the health status, so a drain turns both NOT_SERVING.
    `options`: the main port's gRPC channel arguments beside holdfast's own."""
    server = new_server(interceptors, options)
    add_service(Unregistered(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, Unregistered(server))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer([service_name, health.SERVICE_NAME, reflection.SERVICE_NAME]),
        Unregistered(server))
    serving = Serving(server, health_servicer, _bind(server, listen, credentials, "listen"))
    if health_listen:
        serving.health_server = new_server()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, Unregistered(serving.health_server))
        serving.health_address = _bind(serving.health_server, health_listen, None, "health_listen")
        await serving.health_server.start()
    await server.start()
    for name in ("", service_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return serving


def start_metrics(listen: str) -> str:
    """Serves /metrics on its own thread; returns the bound host:port ("" when not configured)."""
    if not listen:
        return ""
    host, _, port = listen.rpartition(":")
    try:
        httpd, _thread = prometheus_client.start_http_server(int(port), addr=host)
    except OSError as exc:
        raise SystemExit(f"cannot serve metrics on {listen}: {exc.strerror}. Next: free the port or change "
                         "--metrics-listen") from None
    return f"{host}:{httpd.server_port}"


def announce(ready_file: str | None, serving: Serving, metrics: str = "", enroll: str = "") -> None:
    if ready_file:
        extra = {name: value for name, value in (("metrics", metrics), ("health", serving.health_address),
                                                 ("enroll", enroll)) if value}
        # Servers run as root and the file's directory may be shared: never written through a link
        # at its name, nor through one on the way to its directory that another user made or could
        # swap (files.open_user_dir) — the directory is opened once and written through that.
        target = os.path.abspath(ready_file)
        try:
            directory, _ = files.open_user_dir(os.path.dirname(target))
        except OSError as exc:
            raise SystemExit(f"cannot write the ready file {ready_file}: {exc}. Next: name one reached "
                             "through no link another user made or could swap") from None
        try:
            files.write_whole(directory, os.path.basename(target),
                              json.dumps({"address": serving.address, **extra}).encode(), 0o644)
        finally:
            os.close(directory)


def notify(state: str) -> None:
    """sd_notify(3) without libsystemd: `state` to the service manager's socket when one was given.
    A unit of Type=notify is started (and what is ordered after it may start) only on READY=1; a
    manager that cannot be told is no reason to stop serving, so a failed send is ignored."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path.startswith(("/", "@")):
        return
    address = "\0" + path[1:] if path.startswith("@") else path  # "@": the abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock, \
            contextlib.suppress(OSError):
        sock.sendto(state.encode(), address)


async def until_stop_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Only now: a stop the manager sends as soon as it hears READY=1 must drain, not kill.
    notify("READY=1")
    await stop.wait()


async def drain(serving: Serving, grace_seconds: float) -> None:
    notify("STOPPING=1")
    await serving.health.enter_graceful_shutdown()
    await serving.server.stop(grace_seconds)
    if serving.health_server is not None:
        await serving.health_server.stop(0)
