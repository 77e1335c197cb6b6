"""The fast protobuf JSON parse gives exactly json_format's answer, or json_format's error."""

from __future__ import annotations

import json
import random

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from holdfast.coordinator import protojson, records
from holdfast.v1 import coordinator_pb2 as pb

# Every message the coordinator reads back from etcd.
STORED = (pb.SessionRecord, pb.HostRegistration, pb.HistoryEntry, pb.AcquireResponse)
TEXTS = ("", "a", "host-2", "é ünïcødé ☃", 'quote " and \\ slash', "new\nline", "\u2028", "x" * 300)
INTEGER_RANGES = {
    FieldDescriptor.TYPE_UINT32: (0, 2**32), FieldDescriptor.TYPE_FIXED32: (0, 2**32),
    FieldDescriptor.TYPE_UINT64: (0, 2**64), FieldDescriptor.TYPE_FIXED64: (0, 2**64),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63),
}
INTEGERS = (0, 1, 7, 255, 2**31 - 1, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**64 - 1, -1, -(2**31), -(2**63))


def fill(message: Message, rng: random.Random, depth: int = 0) -> None:
    """Every field of `message` set at random (within its type's range), nested messages too."""
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        if rng.random() < 0.25:
            continue  # left at its default: omitted by the encoder
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                for _ in range(rng.randrange(4)):
                    fill(getattr(message, field.name).add(), rng, depth + 1)
            else:
                sub = getattr(message, field.name)
                sub.SetInParent()  # present even when nothing inside is set
                if depth < 4:
                    fill(sub, rng, depth + 1)
        elif field.is_repeated:
            getattr(message, field.name).extend(scalar(field, rng) for _ in range(rng.randrange(4)))
        else:
            setattr(message, field.name, scalar(field, rng))


def scalar(field: FieldDescriptor, rng: random.Random) -> object:
    """A random value of the field's type, within its range."""
    if field.type == FieldDescriptor.TYPE_ENUM:
        return rng.choice(field.enum_type.values).number
    if field.type == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if field.type == FieldDescriptor.TYPE_STRING:
        return rng.choice(TEXTS)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.randrange(40))
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice((0.0, 0.5, -2.25, 1e10))
    low, high = INTEGER_RANGES[field.type]
    return rng.choice([value for value in INTEGERS if low <= value < high])


@pytest.mark.parametrize("cls", STORED, ids=lambda cls: cls.__name__)
def test_what_holdfast_writes_parses_as_json_format_parses_it(cls: type[Message]) -> None:
    assert protojson._fields_of(cls) is not None, "a stored message left the fast path"
    rng = random.Random(cls.__name__)
    for _ in range(300):
        message = cls()
        fill(message, rng)
        raw = records.encode(message)
        parsed = protojson.parse(raw, cls)
        assert parsed == json_format.Parse(raw, cls()) == message
        assert parsed.SerializeToString(deterministic=True) == message.SerializeToString(deterministic=True)


def outcome(raw: bytes | str, parse) -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    try:
        return "parsed", parse(raw).SerializeToString(deterministic=True)
    except Exception as err:  # json_format raises ParseError, and UnicodeDecodeError for non-UTF-8
        return type(err).__name__, str(err).encode()


ODD_INPUTS = [
    b'{"sessionId": "a", "sessionId": "b"}',            # a repeated key
    b'{"session_id": "proto-name"}',                     # the field's proto name, not its JSON name
    b'{"sessionId": "a", "session_id": "b"}',            # both names
    b'{"schemaVersion": 1.0}', b'{"schemaVersion": 1.5}', b'{"schemaVersion": "1.0"}',
    b'{"schemaVersion": " 1"}', b'{"schemaVersion": "+1"}', b'{"schemaVersion": "1_0"}',
    b'{"schemaVersion": -1}', b'{"schemaVersion": 4294967296}', b'{"schemaVersion": true}',
    b'{"schemaVersion": null}', b'{"lease": null}', b'{"lease": []}', b'{"lease": "x"}',
    b'{"lease": {"fence": "18446744073709551616"}}', b'{"lease": {"fence": "007"}}',
    b'{"lease": {"claimStatus": 2}}', b'{"lease": {"claimStatus": "NO_SUCH_STATUS"}}',
    b'{"lease": {"liveOnCommit": "true"}}', b'{"lease": {"liveOnCommit": 1}}',
    b'{"providerHandleChain": {}}', b'{"providerHandleChain": [1]}', b'{"providerHandleChain": null}',
    b'{"sessionId": 5}', b'{"nope": 1}', b'[]', b'"x"', b'{', b'', b'{"sessionId": "\\ud800"}',
    "{\"sessionId\": \"caf\u00e9\"}".encode("utf-16"), b'\xff\xfe', b'{"sessionId": "\xe9"}',
    b'{"lease": {"owner": {"cgroup": {}}}}', b'{"providerHandleChain": [{}, {"handle": "h"}]}',
]


@pytest.mark.parametrize("raw", ODD_INPUTS)
def test_anything_else_gets_json_formats_own_answer(raw: bytes) -> None:
    assert outcome(raw, lambda r: protojson.parse(r, pb.SessionRecord)) == \
        outcome(raw, lambda r: json_format.Parse(r, pb.SessionRecord()))


def test_a_message_type_outside_the_fast_path_is_parsed_by_json_format() -> None:
    manifest = pb.CarryManifest()
    fill(manifest, random.Random(3))
    raw = records.encode(manifest)
    assert protojson._fields_of(pb.CarryManifest) is None  # it has a field the fast path does not take
    assert protojson.parse(raw, pb.CarryManifest) == json_format.Parse(raw, pb.CarryManifest())


def test_an_integer_is_taken_as_a_number_or_a_decimal_string() -> None:
    as_number = json.dumps({"lease": {"fence": 12, "minimumNextFence": "13"}})
    assert protojson.parse(as_number, pb.SessionRecord).lease.fence == 12
    assert protojson.parse(as_number, pb.SessionRecord).lease.minimum_next_fence == 13


WRITTEN = (*STORED, pb.CarryManifest, pb.ListSessionsResponse, pb.GetArchivedSessionResponse)


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda cls: cls.__name__)
def test_what_holdfast_writes_is_what_json_format_writes(cls: type[Message]) -> None:
    rng = random.Random(f"dumps-{cls.__name__}")
    for _ in range(300):
        message = cls()
        fill(message, rng)
        assert protojson.dumps(message) == json_format.MessageToJson(message, indent=None, sort_keys=True)


def test_an_unknown_enum_number_is_written_as_json_format_writes_it() -> None:
    record = pb.SessionRecord(session_id="sess-unknown-enum")
    record.lease.claim_status = 99  # an open enum keeps a number it has no name for
    assert protojson.dumps(record) == json_format.MessageToJson(record, indent=None, sort_keys=True)
    assert '"claimStatus": 99' in protojson.dumps(record)


def test_a_type_with_another_kind_of_field_is_written_by_json_format() -> None:
    request = pb.AcquireRequest(session_id="sess-float", wait_seconds=2.5)  # a double
    fields = pb.FencedPutRequest(session_id="sess-bytes", value=b"\xff\x00")  # bytes
    for message in (request, fields):
        assert protojson.dumps(message) == json_format.MessageToJson(message, indent=None, sort_keys=True)
