"""What a session id, an operation id, a host id, a fence and a spawn token (and its secret) may be:
checked before any I/O by the coordinator and by each agent (which must not rely on the coordinator
having checked), and by the CLI before it sends anything. One definition for all, and no protobuf or
etcd import, so a `run` does not pay for the coordinator's record encoding to check its arguments.

Guarantee: every check is a `fullmatch`: a `$` would let a trailing newline through, into a key or
a cgroup directory name.
"""

from __future__ import annotations

import re

SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{8,128}$")
OPERATION_ID = re.compile(r"^[0-9a-f]{32}$")
HOST_ID = re.compile(r"^[A-Za-z0-9._-]{1,253}$")
SPAWN_TOKEN = re.compile(r"^[0-9a-f]{32}$")   # the form of common/spawn_tokens.spawn_token_for
SPAWN_SECRET = re.compile(r"^[0-9a-f]{64}$")  # the form of common/spawn_tokens.mint_spawn_secret
MAX_FENCE = 2**63 - 1

# The DNS names the coordinator dials agents by: `<host_id>.agent.holdfast.invalid`, carried by agent
# certificates alone (their only DNS name) and refused as any certificate's serve-on name. Were it a
# name another certificate could carry (a host id also given as a serve-on name, as with
# coordinators on the agents' machines), that certificate's holder would answer probes for the host
# as its agent, and a "dead" would grant its sessions away. `.invalid` is reserved (RFC 6761): no
# real server's name lies under it.
AGENT_NAMESPACE = "agent.holdfast.invalid"


class InvalidInput(ValueError):
    """Malformed client input; always INVALID_ARGUMENT and never a write."""


def check_session_id(session_id: str) -> str:
    if not SESSION_ID.fullmatch(session_id):
        raise InvalidInput(f"session id {session_id[:40]!r} must match {SESSION_ID.pattern}")
    return session_id


def check_operation_id(operation_id: str) -> str:
    if not OPERATION_ID.fullmatch(operation_id):
        raise InvalidInput("operation id must be 32 lowercase hex characters")
    return operation_id


def check_host_id(host_id: str) -> str:
    if not HOST_ID.fullmatch(host_id):
        raise InvalidInput(f"host id {host_id[:40]!r} must match {HOST_ID.pattern}")
    return host_id


def agent_server_name(host_id: str) -> str:
    """The name host `host_id`'s agent certificate carries, and the only one a coordinator dialling
    that agent accepts."""
    return f"{host_id}.{AGENT_NAMESPACE}"


def is_spawn_token(token: str) -> bool:
    return SPAWN_TOKEN.fullmatch(token) is not None


def check_spawn_token(token: str, what: str) -> str:
    if not is_spawn_token(token):
        raise InvalidInput(f"{what} must be 32 lowercase hex characters")
    return token


def check_spawn_secret(secret: str, what: str) -> str:
    if not SPAWN_SECRET.fullmatch(secret):
        raise InvalidInput(f"{what} must be 64 lowercase hex characters")
    return secret


def check_fence(fence: int) -> int:
    if not 1 <= fence <= MAX_FENCE:
        raise InvalidInput(f"fence must be in 1..{MAX_FENCE}")
    return fence


def check_acquire_flags(force: bool, await_release: bool) -> None:
    """A forced Acquire has the owner's agent kill the owner's tree, after which that owner is dead
    and has not released: exactly what `await_release` refuses (RELEASE_PENDING). Together they could
    only kill the owner and then be refused, the session kept for that operation; refused here,
    before anything is read, written or signalled."""
    if force and await_release:
        raise InvalidInput("force and await_release cannot be combined: a forced Acquire kills the owner, "
                           "which then never releases, so await_release would refuse it after the kill; "
                           "send one or the other")


def check_text(name: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidInput(f"{name} is {len(value)} characters; the limit is {limit}")
    return value


def check_acquire_texts(provider: str, location: str) -> None:
    """An Acquire's provider and location, checked by the coordinator and, before anything is made
    or asked, by `run` (Owner.start): a takeover's kept operation id is written before its Acquire."""
    check_text("provider", provider, 128)
    check_text("location", location, 1024)
