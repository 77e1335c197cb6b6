"""The owner a commit writes: a gate attested by its own host's agent, never an identity a client sent.

Guarantee: `attest` returns the identity the registered agent of the gate's host read (and moved
into a session cgroup), only when it carries the expected token under the expected variable and is
of that host; with it, the registration it was attested under, which the transaction writing the
owner compares, so an agent that re-registered meanwhile (another incarnation, another token
variable) makes the write lose. A commit at grant (`GateSpawn`, docs/design.md §2) attests before
anything is decided, written or signalled: a gate that cannot be attested refuses the Acquire
with nothing done.
"""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.common import identifiers, spawn_tokens
from holdfast.common.reasons import Reason
from holdfast.coordinator.errors import CoordinatorError
from holdfast.coordinator.registry import decode as decode_registration
from holdfast.coordinator.routing import Router
from holdfast.coordinator.store import Seen
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

MAX_VARIABLE_CHARS = 256


@dataclass(frozen=True)
class Attested:
    identity: apb.ProcessIdentity
    registration: Seen  # the agent registration it was attested under

    def current(self, registration: Seen) -> bool:
        """Whether `registration`, read since, is still the one this was attested under."""
        then, now = self.registration.entry, registration.entry
        return then is not None and now is not None and then.mod_revision == now.mod_revision


def check_gate(gate: pb.GateSpawn) -> str:
    """The gate's token, derived here from its secret; InvalidInput for a malformed gate."""
    identifiers.check_spawn_secret(gate.token_secret, "gate.token_secret")
    if gate.pid_hint <= 0:
        raise identifiers.InvalidInput("gate.pid_hint must be the gate's pid")
    variable = gate.spawn_token_env
    if not variable or len(variable) > MAX_VARIABLE_CHARS or "=" in variable or "\0" in variable:
        raise identifiers.InvalidInput("gate.spawn_token_env must name an environment variable")
    return spawn_tokens.spawn_token_for(gate.token_secret)


async def attest(router: Router, host_id: str, registration: Seen, token: str, variable: str,
                 pid_hint: int, session_id: str, fence: int) -> Attested:
    identity = await router.attest(host_id, decode_registration(registration), token, pid_hint,
                                   session_id, fence)
    if isinstance(identity, str):
        raise CoordinatorError(Reason.ATTESTATION_FAILED, identity)
    if identity.spawn_token != token or identity.host_id != host_id or identity.spawn_token_env != variable:
        raise CoordinatorError(Reason.ATTESTATION_FAILED, "the attested identity is not the reserved token's")
    return Attested(identity, registration)


def commit(lease: pb.Lease, identity: apb.ProcessIdentity, at_ms: int) -> None:
    """The lease owned by the attested identity: committed, or live when it asked to be."""
    lease.owner.CopyFrom(identity)
    lease.claim_status = pb.LIVE if lease.live_on_commit else pb.COMMITTED
    lease.owner_since_unix_ms = lease.last_proven_alive_at_unix_ms = at_ms
