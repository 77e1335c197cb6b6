"""Fences and grant secrets (docs/design.md §3).

Guarantee: the fence moves only through `next_fence`; the record keeps only a secret's hash; the
`fence/<id>` value `<fence>:<claim>:<hash>` is the single thing a fenced write compares against,
so a write carrying an old grant or a wrong secret can never match it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from holdfast.common import identifiers
from holdfast.common.names import claim_name
from holdfast.common.reasons import Reason
from holdfast.coordinator.errors import CoordinatorError
from holdfast.v1 import coordinator_pb2 as pb


def next_fence(fence: int, minimum_next_fence: int) -> int:
    """The only way a fence advances: past the current one and never below the recovery floor."""
    return max(fence + 1, minimum_next_fence)


def mint_grant_secret() -> str:
    return secrets.token_hex(32)


def mint_spawn_token() -> str:
    return secrets.token_hex(16)


def hash_secret(secret: str) -> str:
    # The secret is 256 random bits, so a plain hash is enough: nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, expected_hash: str) -> bool:
    return bool(expected_hash) and hmac.compare_digest(hash_secret(secret), expected_hash)


def fence_value(fence: int, claim_status: int, secret_hash: str) -> str:
    return f"{fence}:{claim_name(claim_status)}:{secret_hash}"


def fence_value_of(record: pb.SessionRecord) -> str:
    lease = record.lease
    return fence_value(lease.fence, lease.claim_status, lease.grant_secret_hash)


def expected_fence_value(fence: int, claim_status: int, secret: str) -> str:
    """What `fence/<id>` must hold for a write carrying this grant to be admitted."""
    return fence_value(fence, claim_status, hash_secret(secret))


def check_grant(record: pb.SessionRecord, fence: int, secret: str) -> None:
    """Fence first, then secret (docs/design.md §3): STALE_FENCE or PERMISSION_DENIED, else None."""
    identifiers.check_fence(fence)
    if fence != record.lease.fence:
        raise CoordinatorError(Reason.STALE_FENCE, f"fence {fence} is not the current {record.lease.fence}")
    if not secret_matches(secret, record.lease.grant_secret_hash):
        raise CoordinatorError(Reason.PERMISSION_DENIED, "grant secret does not match this fence")


def owner_fence_values(fence: int, secret: str) -> tuple[str, str]:
    """What `fence/<id>` holds while this grant's owner is committed, or live: an owner's own writes
    that need no provider handle (its carried state) are admitted in either."""
    return expected_fence_value(fence, pb.COMMITTED, secret), expected_fence_value(fence, pb.LIVE, secret)
