from holdfast.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClaimStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_STATUS_UNSPECIFIED: _ClassVar[ClaimStatus]
    RESERVED: _ClassVar[ClaimStatus]
    COMMITTED: _ClassVar[ClaimStatus]
    LIVE: _ClassVar[ClaimStatus]
    CONFLICTED: _ClassVar[ClaimStatus]
    RELEASED: _ClassVar[ClaimStatus]

class HandoffStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDOFF_STAGE_UNSPECIFIED: _ClassVar[HandoffStage]
    NONE: _ClassVar[HandoffStage]
    HANDOFF_REQUESTED: _ClassVar[HandoffStage]
    MANUAL_RECOVERY: _ClassVar[HandoffStage]
    FORCE_PENDING: _ClassVar[HandoffStage]
CLAIM_STATUS_UNSPECIFIED: ClaimStatus
RESERVED: ClaimStatus
COMMITTED: ClaimStatus
LIVE: ClaimStatus
CONFLICTED: ClaimStatus
RELEASED: ClaimStatus
HANDOFF_STAGE_UNSPECIFIED: HandoffStage
NONE: HandoffStage
HANDOFF_REQUESTED: HandoffStage
MANUAL_RECOVERY: HandoffStage
FORCE_PENDING: HandoffStage

class DeathEvidence(_message.Message):
    __slots__ = ("kind", "detail", "observed_at_unix_ms", "owner_fence")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FENCE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    detail: str
    observed_at_unix_ms: int
    owner_fence: int
    def __init__(self, kind: _Optional[str] = ..., detail: _Optional[str] = ..., observed_at_unix_ms: _Optional[int] = ..., owner_fence: _Optional[int] = ...) -> None: ...

class ProviderHandleLink(_message.Message):
    __slots__ = ("handle", "minted_at_fence", "observed_at_unix_ms")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    MINTED_AT_FENCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    handle: str
    minted_at_fence: int
    observed_at_unix_ms: int
    def __init__(self, handle: _Optional[str] = ..., minted_at_fence: _Optional[int] = ..., observed_at_unix_ms: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("fence", "minimum_next_fence", "claim_status", "handoff_stage", "owner", "reserved_spawn_token", "spawn_token_env", "reserved_host_id", "reserved_at_unix_ms", "commit_deadline_unix_ms", "live_on_commit", "grant_secret_hash", "death_evidence", "last_proven_alive_at_unix_ms", "handoff_operation_hash", "handoff_requested_by_host", "owner_since_unix_ms")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_NEXT_FENCE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_STATUS_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_STAGE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SPAWN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_ENV_FIELD_NUMBER: _ClassVar[int]
    RESERVED_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LIVE_ON_COMMIT_FIELD_NUMBER: _ClassVar[int]
    GRANT_SECRET_HASH_FIELD_NUMBER: _ClassVar[int]
    DEATH_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_PROVEN_ALIVE_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_OPERATION_HASH_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_REQUESTED_BY_HOST_FIELD_NUMBER: _ClassVar[int]
    OWNER_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    fence: int
    minimum_next_fence: int
    claim_status: ClaimStatus
    handoff_stage: HandoffStage
    owner: _agent_pb2.ProcessIdentity
    reserved_spawn_token: str
    spawn_token_env: str
    reserved_host_id: str
    reserved_at_unix_ms: int
    commit_deadline_unix_ms: int
    live_on_commit: bool
    grant_secret_hash: str
    death_evidence: DeathEvidence
    last_proven_alive_at_unix_ms: int
    handoff_operation_hash: str
    handoff_requested_by_host: str
    owner_since_unix_ms: int
    def __init__(self, fence: _Optional[int] = ..., minimum_next_fence: _Optional[int] = ..., claim_status: _Optional[_Union[ClaimStatus, str]] = ..., handoff_stage: _Optional[_Union[HandoffStage, str]] = ..., owner: _Optional[_Union[_agent_pb2.ProcessIdentity, _Mapping]] = ..., reserved_spawn_token: _Optional[str] = ..., spawn_token_env: _Optional[str] = ..., reserved_host_id: _Optional[str] = ..., reserved_at_unix_ms: _Optional[int] = ..., commit_deadline_unix_ms: _Optional[int] = ..., live_on_commit: _Optional[bool] = ..., grant_secret_hash: _Optional[str] = ..., death_evidence: _Optional[_Union[DeathEvidence, _Mapping]] = ..., last_proven_alive_at_unix_ms: _Optional[int] = ..., handoff_operation_hash: _Optional[str] = ..., handoff_requested_by_host: _Optional[str] = ..., owner_since_unix_ms: _Optional[int] = ...) -> None: ...

class SessionRecord(_message.Message):
    __slots__ = ("schema_version", "session_id", "provider", "location", "lease", "provider_handle_chain", "history_seq", "tenant")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_HANDLE_CHAIN_FIELD_NUMBER: _ClassVar[int]
    HISTORY_SEQ_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    session_id: str
    provider: str
    location: str
    lease: Lease
    provider_handle_chain: _containers.RepeatedCompositeFieldContainer[ProviderHandleLink]
    history_seq: int
    tenant: str
    def __init__(self, schema_version: _Optional[int] = ..., session_id: _Optional[str] = ..., provider: _Optional[str] = ..., location: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., provider_handle_chain: _Optional[_Iterable[_Union[ProviderHandleLink, _Mapping]]] = ..., history_seq: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("seq", "at_unix_ms", "transition", "fence", "detail")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at_unix_ms: int
    transition: str
    fence: int
    detail: str
    def __init__(self, seq: _Optional[int] = ..., at_unix_ms: _Optional[int] = ..., transition: _Optional[str] = ..., fence: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "spawn_token", "spawn_token_env", "commit_deadline_unix_ms", "cluster_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_ENV_FIELD_NUMBER: _ClassVar[int]
    COMMIT_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    spawn_token: str
    spawn_token_env: str
    commit_deadline_unix_ms: int
    cluster_id: str
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., spawn_token: _Optional[str] = ..., spawn_token_env: _Optional[str] = ..., commit_deadline_unix_ms: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("session_id", "provider", "location", "expected_fence", "has_expected_fence", "operation_id", "host_id", "live_on_commit", "wait_seconds", "force", "takeover", "await_release", "gate")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FENCE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXPECTED_FENCE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    LIVE_ON_COMMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TAKEOVER_FIELD_NUMBER: _ClassVar[int]
    AWAIT_RELEASE_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    provider: str
    location: str
    expected_fence: int
    has_expected_fence: bool
    operation_id: str
    host_id: str
    live_on_commit: bool
    wait_seconds: float
    force: bool
    takeover: bool
    await_release: bool
    gate: GateSpawn
    def __init__(self, session_id: _Optional[str] = ..., provider: _Optional[str] = ..., location: _Optional[str] = ..., expected_fence: _Optional[int] = ..., has_expected_fence: _Optional[bool] = ..., operation_id: _Optional[str] = ..., host_id: _Optional[str] = ..., live_on_commit: _Optional[bool] = ..., wait_seconds: _Optional[float] = ..., force: _Optional[bool] = ..., takeover: _Optional[bool] = ..., await_release: _Optional[bool] = ..., gate: _Optional[_Union[GateSpawn, _Mapping]] = ...) -> None: ...

class GateSpawn(_message.Message):
    __slots__ = ("pid_hint", "token_secret", "spawn_token_env")
    PID_HINT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SECRET_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_ENV_FIELD_NUMBER: _ClassVar[int]
    pid_hint: int
    token_secret: str
    spawn_token_env: str
    def __init__(self, pid_hint: _Optional[int] = ..., token_secret: _Optional[str] = ..., spawn_token_env: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("grant", "record", "revision")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    record: SessionRecord
    revision: int
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ..., record: _Optional[_Union[SessionRecord, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class HoldEvent(_message.Message):
    __slots__ = ("granted", "change")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    granted: AcquireResponse
    change: SessionEvent
    def __init__(self, granted: _Optional[_Union[AcquireResponse, _Mapping]] = ..., change: _Optional[_Union[SessionEvent, _Mapping]] = ...) -> None: ...

class CommitOwnerRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "pid_hint", "cluster_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    PID_HINT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    pid_hint: int
    cluster_id: str
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., pid_hint: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class CommitOwnerResponse(_message.Message):
    __slots__ = ("record", "cluster_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    cluster_id: str
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class RecordProviderHandleRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "handle", "cluster_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    handle: str
    cluster_id: str
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., handle: _Optional[str] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class RecordProviderHandleResponse(_message.Message):
    __slots__ = ("record", "cluster_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    cluster_id: str
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "cluster_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    cluster_id: str
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("record", "cluster_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    cluster_id: str
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class RequestHandoffRequest(_message.Message):
    __slots__ = ("session_id", "operation_id", "host_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    operation_id: str
    host_id: str
    def __init__(self, session_id: _Optional[str] = ..., operation_id: _Optional[str] = ..., host_id: _Optional[str] = ...) -> None: ...

class RequestHandoffResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ...) -> None: ...

class FencedPutRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "key", "value", "cluster_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    key: str
    value: bytes
    cluster_id: str
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class FencedPutResponse(_message.Message):
    __slots__ = ("revision", "cluster_id")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    revision: int
    cluster_id: str
    def __init__(self, revision: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class FencedGetRequest(_message.Message):
    __slots__ = ("session_id", "key")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    key: str
    def __init__(self, session_id: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class FencedGetResponse(_message.Message):
    __slots__ = ("found", "value", "revision")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    revision: int
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., revision: _Optional[int] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("record", "history")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    history: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., history: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[SessionRecord]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[SessionRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchSessionsRequest(_message.Message):
    __slots__ = ("session_id", "after_revision")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_revision: int
    def __init__(self, session_id: _Optional[str] = ..., after_revision: _Optional[int] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("record", "deleted", "resync", "cluster_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    deleted: bool
    resync: bool
    cluster_id: str
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., deleted: _Optional[bool] = ..., resync: _Optional[bool] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class ProbeSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ProbeSessionResponse(_message.Message):
    __slots__ = ("verdict", "reason", "probe", "record")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    verdict: str
    reason: str
    probe: _agent_pb2.ProbeResult
    record: SessionRecord
    def __init__(self, verdict: _Optional[str] = ..., reason: _Optional[str] = ..., probe: _Optional[_Union[_agent_pb2.ProbeResult, _Mapping]] = ..., record: _Optional[_Union[SessionRecord, _Mapping]] = ...) -> None: ...

class RecoverRequest(_message.Message):
    __slots__ = ("session_id", "expected_fence", "reason", "operator")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    expected_fence: int
    reason: str
    operator: str
    def __init__(self, session_id: _Optional[str] = ..., expected_fence: _Optional[int] = ..., reason: _Optional[str] = ..., operator: _Optional[str] = ...) -> None: ...

class RecoverResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ...) -> None: ...

class HostRegistration(_message.Message):
    __slots__ = ("host_id", "address", "incarnation", "spawn_token_env", "agent_version", "registered_at_unix_ms", "lease_id", "draining", "node_uid")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TOKEN_ENV_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    NODE_UID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    address: str
    incarnation: _agent_pb2.HostIncarnation
    spawn_token_env: str
    agent_version: str
    registered_at_unix_ms: int
    lease_id: int
    draining: bool
    node_uid: str
    def __init__(self, host_id: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[_Union[_agent_pb2.HostIncarnation, _Mapping]] = ..., spawn_token_env: _Optional[str] = ..., agent_version: _Optional[str] = ..., registered_at_unix_ms: _Optional[int] = ..., lease_id: _Optional[int] = ..., draining: _Optional[bool] = ..., node_uid: _Optional[str] = ...) -> None: ...

class RegisterHostRequest(_message.Message):
    __slots__ = ("registration", "ttl_seconds")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    registration: HostRegistration
    ttl_seconds: int
    def __init__(self, registration: _Optional[_Union[HostRegistration, _Mapping]] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class RegisterHostResponse(_message.Message):
    __slots__ = ("lease_id", "ttl_seconds")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    ttl_seconds: int
    def __init__(self, lease_id: _Optional[int] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("host_id", "lease_id")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    lease_id: int
    def __init__(self, host_id: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("ttl_seconds",)
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: int
    def __init__(self, ttl_seconds: _Optional[int] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("hosts", "draining_host_ids", "fence_states")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_HOST_IDS_FIELD_NUMBER: _ClassVar[int]
    FENCE_STATES_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostRegistration]
    draining_host_ids: _containers.RepeatedScalarFieldContainer[str]
    fence_states: _containers.RepeatedCompositeFieldContainer[HostFenceState]
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostRegistration, _Mapping]]] = ..., draining_host_ids: _Optional[_Iterable[str]] = ..., fence_states: _Optional[_Iterable[_Union[HostFenceState, _Mapping]]] = ...) -> None: ...

class FenceAction(_message.Message):
    __slots__ = ("action", "ran", "exit_code", "timed_out", "stdout", "stderr", "error", "took_ms")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RAN_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOOK_MS_FIELD_NUMBER: _ClassVar[int]
    action: str
    ran: bool
    exit_code: int
    timed_out: bool
    stdout: str
    stderr: str
    error: str
    took_ms: int
    def __init__(self, action: _Optional[str] = ..., ran: _Optional[bool] = ..., exit_code: _Optional[int] = ..., timed_out: _Optional[bool] = ..., stdout: _Optional[str] = ..., stderr: _Optional[str] = ..., error: _Optional[str] = ..., took_ms: _Optional[int] = ...) -> None: ...

class FenceAttempt(_message.Message):
    __slots__ = ("host_id", "incarnation", "program", "coordinator", "requested_by", "started_at_unix_ms", "ended_at_unix_ms", "actions", "answer", "detail", "failures", "absent_for_ms")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    incarnation: _agent_pb2.HostIncarnation
    program: str
    coordinator: str
    requested_by: str
    started_at_unix_ms: int
    ended_at_unix_ms: int
    actions: _containers.RepeatedCompositeFieldContainer[FenceAction]
    answer: str
    detail: str
    failures: int
    absent_for_ms: int
    def __init__(self, host_id: _Optional[str] = ..., incarnation: _Optional[_Union[_agent_pb2.HostIncarnation, _Mapping]] = ..., program: _Optional[str] = ..., coordinator: _Optional[str] = ..., requested_by: _Optional[str] = ..., started_at_unix_ms: _Optional[int] = ..., ended_at_unix_ms: _Optional[int] = ..., actions: _Optional[_Iterable[_Union[FenceAction, _Mapping]]] = ..., answer: _Optional[str] = ..., detail: _Optional[str] = ..., failures: _Optional[int] = ..., absent_for_ms: _Optional[int] = ...) -> None: ...

class HostFenceState(_message.Message):
    __slots__ = ("host_id", "absent_since_unix_ms", "state", "attempt", "fencer")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ABSENT_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCER_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    absent_since_unix_ms: int
    state: str
    attempt: FenceAttempt
    fencer: str
    def __init__(self, host_id: _Optional[str] = ..., absent_since_unix_ms: _Optional[int] = ..., state: _Optional[str] = ..., attempt: _Optional[_Union[FenceAttempt, _Mapping]] = ..., fencer: _Optional[str] = ...) -> None: ...

class FenceHostRequest(_message.Message):
    __slots__ = ("host_id", "reason", "operator")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    reason: str
    operator: str
    def __init__(self, host_id: _Optional[str] = ..., reason: _Optional[str] = ..., operator: _Optional[str] = ...) -> None: ...

class FenceHostResponse(_message.Message):
    __slots__ = ("attempt", "results")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    attempt: FenceAttempt
    results: _containers.RepeatedCompositeFieldContainer[RecoverHostResult]
    def __init__(self, attempt: _Optional[_Union[FenceAttempt, _Mapping]] = ..., results: _Optional[_Iterable[_Union[RecoverHostResult, _Mapping]]] = ...) -> None: ...

class ArchiveSessionRequest(_message.Message):
    __slots__ = ("session_id", "expected_fence", "operator", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FENCE_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    expected_fence: int
    operator: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., expected_fence: _Optional[int] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ArchiveSessionResponse(_message.Message):
    __slots__ = ("record", "history_archived", "verdict")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    history_archived: int
    verdict: str
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., history_archived: _Optional[int] = ..., verdict: _Optional[str] = ...) -> None: ...

class GetArchivedSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetArchivedSessionResponse(_message.Message):
    __slots__ = ("record", "history")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    record: SessionRecord
    history: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    def __init__(self, record: _Optional[_Union[SessionRecord, _Mapping]] = ..., history: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ...) -> None: ...

class PurgeArchivesRequest(_message.Message):
    __slots__ = ("older_than_seconds", "limit")
    OLDER_THAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    older_than_seconds: int
    limit: int
    def __init__(self, older_than_seconds: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class PurgeArchivesResponse(_message.Message):
    __slots__ = ("purged", "more")
    PURGED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    purged: _containers.RepeatedScalarFieldContainer[str]
    more: bool
    def __init__(self, purged: _Optional[_Iterable[str]] = ..., more: _Optional[bool] = ...) -> None: ...

class DrainHostRequest(_message.Message):
    __slots__ = ("host_id", "draining", "operator")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    draining: bool
    operator: str
    def __init__(self, host_id: _Optional[str] = ..., draining: _Optional[bool] = ..., operator: _Optional[str] = ...) -> None: ...

class DrainHostResponse(_message.Message):
    __slots__ = ("draining", "handoff_requested", "still_owned", "skipped")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    STILL_OWNED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    handoff_requested: _containers.RepeatedScalarFieldContainer[str]
    still_owned: _containers.RepeatedScalarFieldContainer[str]
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, draining: _Optional[bool] = ..., handoff_requested: _Optional[_Iterable[str]] = ..., still_owned: _Optional[_Iterable[str]] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...

class RecoverHostRequest(_message.Message):
    __slots__ = ("host_id", "reason", "operator")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    reason: str
    operator: str
    def __init__(self, host_id: _Optional[str] = ..., reason: _Optional[str] = ..., operator: _Optional[str] = ...) -> None: ...

class RecoverHostResult(_message.Message):
    __slots__ = ("session_id", "fence", "recovered", "error")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    recovered: bool
    error: str
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., recovered: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class RecoverHostResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RecoverHostResult]
    def __init__(self, results: _Optional[_Iterable[_Union[RecoverHostResult, _Mapping]]] = ...) -> None: ...

class RestoreEpochRequest(_message.Message):
    __slots__ = ("epoch", "operator", "reason", "expected_hosts")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    operator: str
    reason: str
    expected_hosts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: _Optional[int] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ..., expected_hosts: _Optional[_Iterable[str]] = ...) -> None: ...

class RestoreEpochSession(_message.Message):
    __slots__ = ("session_id", "old_fence", "minimum_next_fence", "outcome", "detail")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_FENCE_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_NEXT_FENCE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    old_fence: int
    minimum_next_fence: int
    outcome: str
    detail: str
    def __init__(self, session_id: _Optional[str] = ..., old_fence: _Optional[int] = ..., minimum_next_fence: _Optional[int] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RestoreEpochHost(_message.Message):
    __slots__ = ("host_id", "complete", "roots", "orphans_stopped", "orphans_not_stopped", "error")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_STOPPED_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_NOT_STOPPED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    complete: bool
    roots: int
    orphans_stopped: _containers.RepeatedScalarFieldContainer[str]
    orphans_not_stopped: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, host_id: _Optional[str] = ..., complete: _Optional[bool] = ..., roots: _Optional[int] = ..., orphans_stopped: _Optional[_Iterable[str]] = ..., orphans_not_stopped: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class RestoreEpochResponse(_message.Message):
    __slots__ = ("sessions", "hosts", "grants_reopened")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_REOPENED_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[RestoreEpochSession]
    hosts: _containers.RepeatedCompositeFieldContainer[RestoreEpochHost]
    grants_reopened: bool
    def __init__(self, sessions: _Optional[_Iterable[_Union[RestoreEpochSession, _Mapping]]] = ..., hosts: _Optional[_Iterable[_Union[RestoreEpochHost, _Mapping]]] = ..., grants_reopened: _Optional[bool] = ...) -> None: ...

class CarryEntry(_message.Message):
    __slots__ = ("root", "path", "kind", "mode", "size", "sha256", "link_target")
    ROOT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    root: int
    path: str
    kind: str
    mode: int
    size: int
    sha256: str
    link_target: str
    def __init__(self, root: _Optional[int] = ..., path: _Optional[str] = ..., kind: _Optional[str] = ..., mode: _Optional[int] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., link_target: _Optional[str] = ...) -> None: ...

class CarryRoot(_message.Message):
    __slots__ = ("path", "kind")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: str
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class CarryManifest(_message.Message):
    __slots__ = ("schema_version", "session_id", "fence", "host_id", "slot", "written_at_unix_ms", "total_bytes", "chunk_sha256", "roots", "entries", "reason")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SHA256_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    session_id: str
    fence: int
    host_id: str
    slot: int
    written_at_unix_ms: int
    total_bytes: int
    chunk_sha256: _containers.RepeatedScalarFieldContainer[str]
    roots: _containers.RepeatedCompositeFieldContainer[CarryRoot]
    entries: _containers.RepeatedCompositeFieldContainer[CarryEntry]
    reason: str
    def __init__(self, schema_version: _Optional[int] = ..., session_id: _Optional[str] = ..., fence: _Optional[int] = ..., host_id: _Optional[str] = ..., slot: _Optional[int] = ..., written_at_unix_ms: _Optional[int] = ..., total_bytes: _Optional[int] = ..., chunk_sha256: _Optional[_Iterable[str]] = ..., roots: _Optional[_Iterable[_Union[CarryRoot, _Mapping]]] = ..., entries: _Optional[_Iterable[_Union[CarryEntry, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class BeginCarryRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "cluster_id", "total_bytes", "chunks")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    cluster_id: str
    total_bytes: int
    chunks: int
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., cluster_id: _Optional[str] = ..., total_bytes: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class BeginCarryResponse(_message.Message):
    __slots__ = ("slot", "cluster_id")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    slot: int
    cluster_id: str
    def __init__(self, slot: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class PutCarryChunkRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "cluster_id", "slot", "index", "data")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    cluster_id: str
    slot: int
    index: int
    data: bytes
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., cluster_id: _Optional[str] = ..., slot: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutCarryChunkResponse(_message.Message):
    __slots__ = ("cluster_id",)
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    def __init__(self, cluster_id: _Optional[str] = ...) -> None: ...

class CommitCarryRequest(_message.Message):
    __slots__ = ("session_id", "fence", "secret", "cluster_id", "manifest")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fence: int
    secret: str
    cluster_id: str
    manifest: CarryManifest
    def __init__(self, session_id: _Optional[str] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., cluster_id: _Optional[str] = ..., manifest: _Optional[_Union[CarryManifest, _Mapping]] = ...) -> None: ...

class CommitCarryResponse(_message.Message):
    __slots__ = ("revision", "cluster_id")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    revision: int
    cluster_id: str
    def __init__(self, revision: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class GetCarryRequest(_message.Message):
    __slots__ = ("session_id", "with_chunk", "slot", "index", "fence", "secret", "cluster_id", "with_budget")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_CHUNK_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_BUDGET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    with_chunk: bool
    slot: int
    index: int
    fence: int
    secret: str
    cluster_id: str
    with_budget: bool
    def __init__(self, session_id: _Optional[str] = ..., with_chunk: _Optional[bool] = ..., slot: _Optional[int] = ..., index: _Optional[int] = ..., fence: _Optional[int] = ..., secret: _Optional[str] = ..., cluster_id: _Optional[str] = ..., with_budget: _Optional[bool] = ...) -> None: ...

class CarryBudget(_message.Message):
    __slots__ = ("tenant", "tenant_reserved_bytes", "tenant_budget_bytes", "reserved_bytes", "budget_bytes")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TENANT_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    tenant_reserved_bytes: int
    tenant_budget_bytes: int
    reserved_bytes: int
    budget_bytes: int
    def __init__(self, tenant: _Optional[str] = ..., tenant_reserved_bytes: _Optional[int] = ..., tenant_budget_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class GetCarryResponse(_message.Message):
    __slots__ = ("found", "manifest", "chunk", "session_cap_bytes", "budget")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SESSION_CAP_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    manifest: CarryManifest
    chunk: bytes
    session_cap_bytes: int
    budget: CarryBudget
    def __init__(self, found: _Optional[bool] = ..., manifest: _Optional[_Union[CarryManifest, _Mapping]] = ..., chunk: _Optional[bytes] = ..., session_cap_bytes: _Optional[int] = ..., budget: _Optional[_Union[CarryBudget, _Mapping]] = ...) -> None: ...
