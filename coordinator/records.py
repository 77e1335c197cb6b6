"""Session records as protobuf JSON in etcd, and the limits of what an owner may store.

Guarantee: every value written is readable with `etcdctl` and carries SCHEMA_VERSION; a record of
an unknown schema is refused rather than misread; malformed input is rejected before any I/O (ids
and fences by common/identifiers.py, data keys and values here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from google.protobuf.message import Message

from holdfast.common.identifiers import InvalidInput
from holdfast.coordinator import protojson
from holdfast.v1 import coordinator_pb2 as pb

SCHEMA_VERSION = 1
DATA_KEY = re.compile(r"^[A-Za-z0-9._/-]{1,256}$")
# etcd's default request limit (--max-request-bytes) is 1.5 MiB; a fenced value plus its key and the
# transaction's compare must fit one request, so values stop at 1 MiB.
ETCD_REQUEST_LIMIT_BYTES = 1536 * 1024
MAX_VALUE_BYTES = 1024 * 1024
MAX_HANDLE_CHARS = 4096
# A provider handle chain's bytes as stored (its JSON, escapes included). A grant writes the record
# twice in one etcd request (the record and its replay copy, coordinator/acquire.py) and every
# watcher of the session is sent it: a chain of MAX_CHAIN_BYTES keeps the largest record and its copy
# under a quarter of ETCD_REQUEST_LIMIT_BYTES, where 256 full-size handles (~1 MB) would make every
# later grant of the session too large for etcd.
MAX_CHAIN_BYTES = 64 * 1024
# A grant's one etcd request carries the record twice (the put, the replay copy in
# `AcquireResponse(grant, record)`), a third time when it rests on a remembered record (the compare
# of its bytes), beside its fence value, history entry, keys and compares (GRANT_HEADROOM_BYTES).
GRANT_RECORD_COPIES = 2
GRANT_HEADROOM_BYTES = 64 * 1024


def grant_fits(record_bytes: int, remembered: bool) -> bool:
    """Whether a grant of a record of `record_bytes`, read fresh or `remembered`, fits one etcd
    request: a takeover of a record that does not (one written before MAX_CHAIN_BYTES) is refused
    before it asks, kills or writes anything, where its grant would fail at etcd only after the owner
    was told to end. Counting the remembered compare for a fresh read refused records etcd grants."""
    copies = GRANT_RECORD_COPIES + (1 if remembered else 0)
    return copies * record_bytes + GRANT_HEADROOM_BYTES <= ETCD_REQUEST_LIMIT_BYTES


def check_data_key(key: str) -> str:
    if not DATA_KEY.fullmatch(key) or ".." in key.split("/"):
        raise InvalidInput(f"data key must match {DATA_KEY.pattern} without '..' segments")
    return key


def check_value(value: bytes) -> bytes:
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidInput(f"value is {len(value)} bytes; the limit is {MAX_VALUE_BYTES} bytes (one etcd "
                           f"request holds at most {ETCD_REQUEST_LIMIT_BYTES}); split it over several keys")
    return value


def encode(message: Message) -> bytes:
    return protojson.dumps(message).encode()


def chain_bytes(chain: Iterable[pb.ProviderHandleLink]) -> int:
    """The bytes a provider handle chain takes in a stored record (what MAX_CHAIN_BYTES bounds)."""
    return len(encode(pb.SessionRecord(provider_handle_chain=chain)))


def decode_record(raw: bytes) -> pb.SessionRecord:
    return _as_read(protojson.parse(raw, pb.SessionRecord))


def as_decoded(record: pb.SessionRecord) -> pb.SessionRecord:
    """What `decode_record(encode(record))` returns, without the JSON round trip (protojson's is
    lossless for every known field: its output is json_format's, which parses back to an equal
    message)."""
    copy = pb.SessionRecord()
    copy.CopyFrom(record)
    # JSON has no place for fields this version does not know (a newer agent's identity carries
    # them into the owner): a read of the bytes written never has them, so neither does this.
    copy.DiscardUnknownFields()
    return _as_read(copy)


def _as_read(record: pb.SessionRecord) -> pb.SessionRecord:
    if record.schema_version != SCHEMA_VERSION:
        raise ValueError(f"record schema {record.schema_version} is not {SCHEMA_VERSION}")
    owner = record.lease.owner
    if owner.spawn_token and not owner.spawn_token_env:
        # Owners attested before identities named their variable: the lease recorded the one the
        # reserving host's agent registered with, which is where the token was put and read.
        owner.spawn_token_env = record.lease.spawn_token_env
    return record


def new_record(session_id: str, provider: str, location: str) -> pb.SessionRecord:
    return pb.SessionRecord(
        schema_version=SCHEMA_VERSION,
        session_id=session_id,
        provider=provider,
        location=location,
        lease=pb.Lease(handoff_stage=pb.NONE),
    )
