"""The words holdfast shows for its enums, taken from the proto descriptors: one source, so a new
enum value has a name everywhere at once (`HANDOFF_REQUESTED` is "handoff-requested").

Guarantee: `*_UNSPECIFIED` reads as the caller's word for "nothing said" (`none` unless given);
a value this build does not know (a newer peer's) reads as `unknown-<n>`, never as another's name.
Pure.
"""

from __future__ import annotations

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from holdfast.v1 import agent_pb2, coordinator_pb2


def enum_name(enum: EnumTypeWrapper, value: int, unspecified: str = "none") -> str:
    try:
        name = enum.Name(value)
    except ValueError:
        return f"unknown-{value}"
    return unspecified if name.endswith("_UNSPECIFIED") else name.lower().replace("_", "-")


def claim_name(value: int) -> str:
    return enum_name(coordinator_pb2.ClaimStatus, value)


def stage_name(value: int) -> str:
    return enum_name(coordinator_pb2.HandoffStage, value)


def outcome_name(value: int) -> str:
    # An outcome the agent left unspecified proves nothing: it is indeterminate, as the rules read it.
    return enum_name(agent_pb2.ProbeOutcome, value, unspecified="indeterminate")
