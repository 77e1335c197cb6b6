"""HTTP/2 keepalive of every gRPC channel and server holdfast opens, chosen in this one place.

Guarantee: while a call is open on a connection, each end pings the other after `seconds()` without
hearing from it and closes the connection when the ping is not acknowledged within
`ack_timeout(seconds())`: a call to a peer that vanished without a TCP reset (powered off, a
partition, a NAT that dropped the connection, a stopped process) fails UNAVAILABLE within
seconds + ack timeout instead of never. That covers the owner's watch on its Hold call, WatchSessions,
a waiting `run --wait`, the coordinator's WatchExits streams to agents and its etcd Watch stream. A
holdfast server accepts pings down to half its own interval, so a peer set to the same value (or a
higher one) is never sent GOAWAY "too_many_pings". Nothing pings an idle connection (no call open).

The interval is the `keepalive_seconds` setting of `agent serve` and `coordinator serve` (`configure`),
and HOLDFAST_KEEPALIVE_SECONDS for every other process (the CLI, the client library).
"""

from __future__ import annotations

import os

ENV = "HOLDFAST_KEEPALIVE_SECONDS"
DEFAULT_SECONDS = 20
LOWEST_SECONDS, HIGHEST_SECONDS = 1, 3600
# A ping's answer is one round trip; ten seconds covers a loaded peer without waiting a whole
# interval more on a dead one.
ACK_TIMEOUT_CAP_SECONDS = 10
# etcd refuses pings closer than its --grpc-keepalive-min-time (5 s by default) with GOAWAY
# too_many_pings, which would drop the coordinator's one Watch stream: its channel never pings more
# often than twice that, whatever the setting.
ETCD_LOWEST_SECONDS = 10

_configured: int | None = None


def configure(value: int) -> None:
    """A server's resolved setting (LOWEST_SECONDS..HIGHEST_SECONDS), before it opens a channel or a port."""
    global _configured
    _configured = value


def seconds() -> int:
    """The server's setting, else HOLDFAST_KEEPALIVE_SECONDS (ValueError naming it when wrong), else
    the default."""
    if _configured is not None:
        return _configured
    return env_seconds(ENV, DEFAULT_SECONDS, LOWEST_SECONDS, HIGHEST_SECONDS)


def env_seconds(name: str, default: int, lowest: int, highest: int) -> int:
    """$name, a whole number of seconds in lowest..highest (ValueError naming it when not), else
    `default`."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    value = int(raw) if raw.isascii() and raw.isdigit() else 0
    if not lowest <= value <= highest:
        raise ValueError(f"{name}={raw[:40]!r} is not a whole number of seconds in {lowest}..{highest}")
    return value


def ack_timeout(interval: int) -> int:
    return min(interval, ACK_TIMEOUT_CAP_SECONDS)


def _pings(interval: int) -> list[tuple[str, object]]:
    return [
        ("grpc.keepalive_time_ms", interval * 1000),
        ("grpc.keepalive_timeout_ms", ack_timeout(interval) * 1000),
        ("grpc.keepalive_permit_without_calls", 0),
        # gRPC core otherwise stops pinging after two pings without a data frame to send: an idle
        # watch sends none, and a peer dying after its first minute would never be noticed.
        ("grpc.http2.max_pings_without_data", 0),
        # What gRPC core (1.85) waits for a keepalive ping's ack is this, one minute by default:
        # keepalive_timeout_ms alone left a silenced watch open past a minute (measured).
        ("grpc.http2.ping_timeout_ms", ack_timeout(interval) * 1000),
    ]


def channel_options(lowest: int = LOWEST_SECONDS) -> list[tuple[str, object]]:
    """A client channel's keepalive; `lowest` bounds the interval from below for a server whose ping
    policy is not ours (etcd's)."""
    return _pings(max(seconds(), lowest))


def server_options() -> list[tuple[str, object]]:
    """A server's: it pings its callers as clients do (a vanished owner's Hold call and the watch
    behind it end), and accepts their pings down to half its interval (a peer's pings may arrive a
    little early, and three too early ones cost the connection its calls: GOAWAY too_many_pings)."""
    interval = seconds()
    return [*_pings(interval), ("grpc.http2.min_ping_interval_without_data_ms", interval * 500)]
