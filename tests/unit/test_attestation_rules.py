"""The gate an Acquire carries: checked before any I/O, its token derived from its secret alone,
and its attestation current only under the registration it was made under."""

from __future__ import annotations

import pytest

from holdfast.common import identifiers, spawn_tokens
from holdfast.coordinator.attestation import Attested, check_gate
from holdfast.coordinator.store import Entry, Seen
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

SECRET = "ab" * 32


def gate(**fields: object) -> pb.GateSpawn:
    base: dict[str, object] = {"pid_hint": 42, "token_secret": SECRET,
                               "spawn_token_env": spawn_tokens.DEFAULT_VARIABLE}
    base.update(fields)
    return pb.GateSpawn(**base)  # type: ignore[arg-type]


def test_a_gates_token_is_derived_from_its_secret_and_looks_like_every_token() -> None:
    token = check_gate(gate())
    assert token == spawn_tokens.spawn_token_for(SECRET) and len(token) == 32 and int(token, 16) >= 0
    assert token != SECRET[:32] and check_gate(gate(token_secret="cd" * 32)) != token


@pytest.mark.parametrize("bad", [
    {"token_secret": "ab" * 16},          # a token's length, not a secret's
    {"token_secret": "AB" * 32},          # upper case
    {"token_secret": "zz" * 32},
    {"token_secret": ""},
    {"pid_hint": 0},
    {"spawn_token_env": ""},
    {"spawn_token_env": "A=B"},
    {"spawn_token_env": "A\0B"},
    {"spawn_token_env": "V" * 257},
])
def test_a_malformed_gate_is_invalid_input(bad: dict[str, object]) -> None:
    with pytest.raises(identifiers.InvalidInput):
        check_gate(gate(**bad))


def seen(revision: int | None) -> Seen:
    entry = None if revision is None else Entry("hosts/h", b"{}", revision, revision, 7)
    return Seen("hosts/h", entry)


def test_an_attestation_is_current_only_under_the_registration_it_was_made_under() -> None:
    attested = Attested(apb.ProcessIdentity(host_id="h", pid=42), seen(10))
    assert attested.current(seen(10))
    assert not attested.current(seen(11))    # the agent re-registered (another incarnation, variable)
    assert not attested.current(seen(None))  # no registration at all now
    assert not Attested(apb.ProcessIdentity(), seen(None)).current(seen(None))
