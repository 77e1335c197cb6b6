"""Pure tests of fence-key values, secret hashing and input validation."""

from __future__ import annotations

import pytest

from holdfast.common import identifiers
from holdfast.coordinator import fencing, records
from holdfast.v1 import coordinator_pb2 as pb


def test_fence_value_layout_and_secret_binding() -> None:
    secret = fencing.mint_grant_secret()
    value = fencing.fence_value(7, pb.LIVE, fencing.hash_secret(secret))
    assert value == f"7:live:{fencing.hash_secret(secret)}"
    assert fencing.expected_fence_value(7, pb.LIVE, secret) == value
    assert fencing.expected_fence_value(6, pb.LIVE, secret) != value
    assert fencing.expected_fence_value(7, pb.COMMITTED, secret) != value
    assert fencing.expected_fence_value(7, pb.LIVE, fencing.mint_grant_secret()) != value
    assert secret not in value


def test_secret_matches_only_its_hash() -> None:
    secret = fencing.mint_grant_secret()
    assert fencing.secret_matches(secret, fencing.hash_secret(secret))
    assert not fencing.secret_matches(secret, "")
    assert not fencing.secret_matches("", fencing.hash_secret(secret))


@pytest.mark.parametrize("sid", ["abcdefgh", "A-b_c-12345678", "x" * 128])
def test_good_session_ids(sid: str) -> None:
    assert identifiers.check_session_id(sid) == sid


@pytest.mark.parametrize(
    "sid", ["", "short", "x" * 129, "has space1", "slash/inside", "ünïcode12", "abcdefgh\n"]
)
def test_bad_session_ids(sid: str) -> None:
    with pytest.raises(identifiers.InvalidInput):
        identifiers.check_session_id(sid)


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (identifiers.check_fence, 0),
        (identifiers.check_fence, 2**63),
        (identifiers.check_operation_id, "A" * 32),
        (identifiers.check_operation_id, "0" * 31),
        (records.check_data_key, "../x"),
        (records.check_data_key, ""),
        (identifiers.check_host_id, ""),
        (records.check_value, b"x" * (records.MAX_VALUE_BYTES + 1)),
    ],
)
def test_bad_inputs_are_refused(check, value) -> None:
    with pytest.raises(identifiers.InvalidInput):
        check(value)


def test_record_round_trip_and_schema_check() -> None:
    record = records.new_record("session-1", "codex", "/w")
    assert records.decode_record(records.encode(record)) == record
    record.schema_version = 99
    with pytest.raises(ValueError):
        records.decode_record(records.encode(record))
