from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TreeProof(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TREE_PROOF_UNSPECIFIED: _ClassVar[TreeProof]
    CGROUP_ONLY: _ClassVar[TreeProof]
    CGROUP_AND_SCAN: _ClassVar[TreeProof]
    SCAN_ONLY: _ClassVar[TreeProof]

class ProbeOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_OUTCOME_UNSPECIFIED: _ClassVar[ProbeOutcome]
    EXIT_OBSERVED: _ClassVar[ProbeOutcome]
    PID_ABSENT: _ClassVar[ProbeOutcome]
    IDENTITY_MISMATCH: _ClassVar[ProbeOutcome]
    IDENTITY_MATCHED: _ClassVar[ProbeOutcome]
    RESERVATION_UNUSED: _ClassVar[ProbeOutcome]
    INDETERMINATE: _ClassVar[ProbeOutcome]

class TreeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TREE_UNCHECKED: _ClassVar[TreeState]
    TREE_GONE: _ClassVar[TreeState]
    TREE_ALIVE: _ClassVar[TreeState]
    TREE_UNPROVEN: _ClassVar[TreeState]
TREE_PROOF_UNSPECIFIED: TreeProof
CGROUP_ONLY: TreeProof
CGROUP_AND_SCAN: TreeProof
SCAN_ONLY: TreeProof
PROBE_OUTCOME_UNSPECIFIED: ProbeOutcome
EXIT_OBSERVED: ProbeOutcome
PID_ABSENT: ProbeOutcome
IDENTITY_MISMATCH: ProbeOutcome
IDENTITY_MATCHED: ProbeOutcome
RESERVATION_UNUSED: ProbeOutcome
INDETERMINATE: ProbeOutcome
TREE_UNCHECKED: TreeState
TREE_GONE: TreeState
TREE_ALIVE: TreeState
TREE_UNPROVEN: TreeState

class HostIncarnation(_message.Message):
    __slots__ = ("machine_id", "boot_id", "pid_ns", "ns_init_start_ticks")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    PID_NS_FIELD_NUMBER: _ClassVar[int]
    NS_INIT_START_TICKS_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    boot_id: str
    pid_ns: int
    ns_init_start_ticks: int
    def __init__(self, machine_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., pid_ns: _Optional[int] = ..., ns_init_start_ticks: _Optional[int] = ...) -> None: ...

class CgroupRef(_message.Message):
    __slots__ = ("path", "inode", "cgroup_ns")
    PATH_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_NS_FIELD_NUMBER: _ClassVar[int]
    path: str
    inode: int
    cgroup_ns: int
    def __init__(self, path: _Optional[str] = ..., inode: _Optional[int] = ..., cgroup_ns: _Optional[int] = ...) -> None: ...

class ProcessIdentity(_message.Message):
    __slots__ = ("host_id", "incarnation", "pid", "start_ticks", "pidfd_ino", "spawn_token", "cgroup", "spawn_token_env", "tree_proof", "tree_proof_reason")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TICKS_FIELD_NUMBER: _ClassVar[int]
    PIDFD_INO_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_ENV_FIELD_NUMBER: _ClassVar[int]
    TREE_PROOF_FIELD_NUMBER: _ClassVar[int]
    TREE_PROOF_REASON_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    incarnation: HostIncarnation
    pid: int
    start_ticks: int
    pidfd_ino: int
    spawn_token: str
    cgroup: CgroupRef
    spawn_token_env: str
    tree_proof: TreeProof
    tree_proof_reason: str
    def __init__(self, host_id: _Optional[str] = ..., incarnation: _Optional[_Union[HostIncarnation, _Mapping]] = ..., pid: _Optional[int] = ..., start_ticks: _Optional[int] = ..., pidfd_ino: _Optional[int] = ..., spawn_token: _Optional[str] = ..., cgroup: _Optional[_Union[CgroupRef, _Mapping]] = ..., spawn_token_env: _Optional[str] = ..., tree_proof: _Optional[_Union[TreeProof, str]] = ..., tree_proof_reason: _Optional[str] = ...) -> None: ...

class GetHostInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HostInfo(_message.Message):
    __slots__ = ("host_id", "incarnation", "clock_ticks_per_second", "can_enumerate", "pidfs", "cgroup_writable", "cgroup_root", "agent_version", "spawn_token_env", "session_cgroups", "session_cgroups_reason")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLOCK_TICKS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CAN_ENUMERATE_FIELD_NUMBER: _ClassVar[int]
    PIDFS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_WRITABLE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_ROOT_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_ENV_FIELD_NUMBER: _ClassVar[int]
    SESSION_CGROUPS_FIELD_NUMBER: _ClassVar[int]
    SESSION_CGROUPS_REASON_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    incarnation: HostIncarnation
    clock_ticks_per_second: int
    can_enumerate: bool
    pidfs: bool
    cgroup_writable: bool
    cgroup_root: str
    agent_version: str
    spawn_token_env: str
    session_cgroups: bool
    session_cgroups_reason: str
    def __init__(self, host_id: _Optional[str] = ..., incarnation: _Optional[_Union[HostIncarnation, _Mapping]] = ..., clock_ticks_per_second: _Optional[int] = ..., can_enumerate: _Optional[bool] = ..., pidfs: _Optional[bool] = ..., cgroup_writable: _Optional[bool] = ..., cgroup_root: _Optional[str] = ..., agent_version: _Optional[str] = ..., spawn_token_env: _Optional[str] = ..., session_cgroups: _Optional[bool] = ..., session_cgroups_reason: _Optional[str] = ...) -> None: ...

class ScanSpawnTokenRequest(_message.Message):
    __slots__ = ("spawn_token",)
    SPAWN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    spawn_token: str
    def __init__(self, spawn_token: _Optional[str] = ...) -> None: ...

class TokenCarrier(_message.Message):
    __slots__ = ("pid", "ppid", "root")
    PID_FIELD_NUMBER: _ClassVar[int]
    PPID_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    pid: int
    ppid: int
    root: bool
    def __init__(self, pid: _Optional[int] = ..., ppid: _Optional[int] = ..., root: _Optional[bool] = ...) -> None: ...

class ScanResult(_message.Message):
    __slots__ = ("enumerable", "complete", "scanned", "unreadable", "carriers", "passes", "stable", "init_unreadable")
    ENUMERABLE_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    CARRIERS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    STABLE_FIELD_NUMBER: _ClassVar[int]
    INIT_UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    enumerable: bool
    complete: bool
    scanned: int
    unreadable: int
    carriers: _containers.RepeatedCompositeFieldContainer[TokenCarrier]
    passes: int
    stable: bool
    init_unreadable: bool
    def __init__(self, enumerable: _Optional[bool] = ..., complete: _Optional[bool] = ..., scanned: _Optional[int] = ..., unreadable: _Optional[int] = ..., carriers: _Optional[_Iterable[_Union[TokenCarrier, _Mapping]]] = ..., passes: _Optional[int] = ..., stable: _Optional[bool] = ..., init_unreadable: _Optional[bool] = ...) -> None: ...

class AttestSpawnRequest(_message.Message):
    __slots__ = ("spawn_token", "pid_hint", "session_id", "fence")
    SPAWN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PID_HINT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    spawn_token: str
    pid_hint: int
    session_id: str
    fence: int
    def __init__(self, spawn_token: _Optional[str] = ..., pid_hint: _Optional[int] = ..., session_id: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class AttestSpawnResponse(_message.Message):
    __slots__ = ("identity",)
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    identity: ProcessIdentity
    def __init__(self, identity: _Optional[_Union[ProcessIdentity, _Mapping]] = ...) -> None: ...

class ListTokenRootsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TokenRoot(_message.Message):
    __slots__ = ("identity",)
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    identity: ProcessIdentity
    def __init__(self, identity: _Optional[_Union[ProcessIdentity, _Mapping]] = ...) -> None: ...

class ListTokenRootsResponse(_message.Message):
    __slots__ = ("complete", "unreadable", "roots")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    unreadable: int
    roots: _containers.RepeatedCompositeFieldContainer[TokenRoot]
    def __init__(self, complete: _Optional[bool] = ..., unreadable: _Optional[int] = ..., roots: _Optional[_Iterable[_Union[TokenRoot, _Mapping]]] = ...) -> None: ...

class ProbeResult(_message.Message):
    __slots__ = ("outcome", "mismatch_field", "matched_on", "reason", "tree_checked", "tree_gone", "tree_reason", "answered_by_host_id", "answered_by_incarnation", "observed_at_unix_ms", "contradiction", "tree_state")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_FIELD_FIELD_NUMBER: _ClassVar[int]
    MATCHED_ON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TREE_CHECKED_FIELD_NUMBER: _ClassVar[int]
    TREE_GONE_FIELD_NUMBER: _ClassVar[int]
    TREE_REASON_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONTRADICTION_FIELD_NUMBER: _ClassVar[int]
    TREE_STATE_FIELD_NUMBER: _ClassVar[int]
    outcome: ProbeOutcome
    mismatch_field: str
    matched_on: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    tree_checked: bool
    tree_gone: bool
    tree_reason: str
    answered_by_host_id: str
    answered_by_incarnation: HostIncarnation
    observed_at_unix_ms: int
    contradiction: bool
    tree_state: TreeState
    def __init__(self, outcome: _Optional[_Union[ProbeOutcome, str]] = ..., mismatch_field: _Optional[str] = ..., matched_on: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., tree_checked: _Optional[bool] = ..., tree_gone: _Optional[bool] = ..., tree_reason: _Optional[str] = ..., answered_by_host_id: _Optional[str] = ..., answered_by_incarnation: _Optional[_Union[HostIncarnation, _Mapping]] = ..., observed_at_unix_ms: _Optional[int] = ..., contradiction: _Optional[bool] = ..., tree_state: _Optional[_Union[TreeState, str]] = ...) -> None: ...

class ProbeOwnersRequest(_message.Message):
    __slots__ = ("owners", "check_tree")
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    CHECK_TREE_FIELD_NUMBER: _ClassVar[int]
    owners: _containers.RepeatedCompositeFieldContainer[ProcessIdentity]
    check_tree: bool
    def __init__(self, owners: _Optional[_Iterable[_Union[ProcessIdentity, _Mapping]]] = ..., check_tree: _Optional[bool] = ...) -> None: ...

class ProbeOwnersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ProbeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ProbeResult, _Mapping]]] = ...) -> None: ...

class WatchExitsRequest(_message.Message):
    __slots__ = ("owners", "check_tree")
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    CHECK_TREE_FIELD_NUMBER: _ClassVar[int]
    owners: _containers.RepeatedCompositeFieldContainer[ProcessIdentity]
    check_tree: bool
    def __init__(self, owners: _Optional[_Iterable[_Union[ProcessIdentity, _Mapping]]] = ..., check_tree: _Optional[bool] = ...) -> None: ...

class ExitEvent(_message.Message):
    __slots__ = ("identity", "result", "armed")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ARMED_FIELD_NUMBER: _ClassVar[int]
    identity: ProcessIdentity
    result: ProbeResult
    armed: bool
    def __init__(self, identity: _Optional[_Union[ProcessIdentity, _Mapping]] = ..., result: _Optional[_Union[ProbeResult, _Mapping]] = ..., armed: _Optional[bool] = ...) -> None: ...

class KillOwnerRequest(_message.Message):
    __slots__ = ("owner", "wait_seconds")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    owner: ProcessIdentity
    wait_seconds: float
    def __init__(self, owner: _Optional[_Union[ProcessIdentity, _Mapping]] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class KillOwnerResponse(_message.Message):
    __slots__ = ("result", "signalled")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SIGNALLED_FIELD_NUMBER: _ClassVar[int]
    result: ProbeResult
    signalled: int
    def __init__(self, result: _Optional[_Union[ProbeResult, _Mapping]] = ..., signalled: _Optional[int] = ...) -> None: ...
