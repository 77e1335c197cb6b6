"""What a HostAgent request may carry, checked whole before anything is read, made or signalled.

Guarantee: every identifier is checked with common/identifiers (`fullmatch`), the agent's own check
and not the coordinator's: a session id with a trailing newline, or a token of any other form, is
refused INVALID_ARGUMENT with no cgroup made, no process moved and nothing signalled. Each check
raises `identifiers.InvalidInput`, naming the field.
"""

from __future__ import annotations

from holdfast.common import identifiers
from holdfast.common.identifiers import InvalidInput
from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2

MAX_BATCH = 1024
MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_KILL_WAIT = 60.0
MAX_VARIABLE_CHARS = 256


def check_identity(identity: agent_pb2.ProcessIdentity, what: str) -> None:
    if not identity.host_id:
        raise InvalidInput(f"{what}: host_id is missing")
    if not identity.HasField("incarnation") or not identity.incarnation.boot_id:
        raise InvalidInput(f"{what}: incarnation is missing")
    if not 0 < identity.pid < MAX_PID:
        raise InvalidInput(f"{what}: pid must be in 1..{MAX_PID - 1}, got {identity.pid}")
    if identity.start_ticks <= 0:
        raise InvalidInput(f"{what}: start_ticks is missing")
    if identity.spawn_token:
        identifiers.check_spawn_token(identity.spawn_token, f"{what}: spawn token")
    if len(identity.spawn_token_env) > MAX_VARIABLE_CHARS or "\0" in identity.spawn_token_env:
        raise InvalidInput(f"{what}: spawn_token_env must be a variable name")
    path = identity.cgroup.path
    if path and not path.startswith("/"):
        raise InvalidInput(f"{what}: cgroup path must be absolute")
    # A NUL would make the handler raise (UNKNOWN, not a refusal); `..` would let a request name a
    # cgroup outside the one recorded for the owner.
    if "\0" in path or ".." in path.split("/"):
        raise InvalidInput(f"{what}: cgroup path must not contain NUL or '..' segments")


def check_batch(owners: list[agent_pb2.ProcessIdentity]) -> None:
    if not owners:
        raise InvalidInput("owners is empty")
    if len(owners) > MAX_BATCH:
        raise InvalidInput(f"batch of {len(owners)} owners exceeds the limit of {MAX_BATCH}")
    for i, owner in enumerate(owners):
        check_identity(owner, f"owners[{i}]")


def check_scan(request: agent_pb2.ScanSpawnTokenRequest) -> None:
    identifiers.check_spawn_token(request.spawn_token, "spawn_token")


def check_attest(request: agent_pb2.AttestSpawnRequest) -> None:
    """A session id names the cgroup directory the attestation makes: the id's own rule, whole."""
    identifiers.check_spawn_token(request.spawn_token, "spawn_token")
    if request.pid_hint >= MAX_PID:
        raise InvalidInput(f"pid_hint must be below {MAX_PID}")
    if request.session_id:
        identifiers.check_session_id(request.session_id)
        identifiers.check_fence(request.fence)


def check_kill(request: agent_pb2.KillOwnerRequest, cgroup_root: str) -> None:
    """Only a session cgroup of this host may be named: a kill never reaches another cgroup."""
    if not request.HasField("owner"):
        raise InvalidInput("owner is missing")
    check_identity(request.owner, "owner")
    cgroup = request.owner.cgroup.path
    if cgroup and not cgroups.is_session_cgroup(cgroup, cgroup_root):
        where = cgroup_root or "its cgroup root"
        raise InvalidInput(f"owner: {cgroup} is not a session cgroup of this host "
                           f"(holdfast-<session>-<fence>-<random> under {where})")
    if not 0 <= request.wait_seconds <= MAX_KILL_WAIT:
        raise InvalidInput(f"wait_seconds must be in 0..{MAX_KILL_WAIT}")
