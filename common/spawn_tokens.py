"""A spawn token a `run` mints before its grant, as the hash of a secret only that `run` holds.

Guarantee: the token, `spawn_token_for(secret)`, is what the gate's environment carries, and so
what any process of its user can read there; the secret is in no environment and goes only to the
coordinator, which derives the token itself. So naming a process in an Acquire needs the secret of
the token that process carries: a caller who read another tree's token cannot have that tree's
process attested (and moved into its own session cgroup) as its gate. A token minted by the
coordinator at the grant gave the same, one round trip later: after the grant, not before it.
"""

from __future__ import annotations

import hashlib
import os

_DOMAIN = b"holdfast spawn token v1\0"
DEFAULT_VARIABLE = "HOLDFAST_SPAWN_TOKEN"  # the agent's --spawn-token-env unless set otherwise
VARIABLE_ENV = "HOLDFAST_SPAWN_TOKEN_ENV"  # where an agent's setting, and a run's guess of it, is read


def random_hex(nbytes: int) -> str:
    """`secrets.token_hex` itself (os.urandom, hex), without the module: `secrets` imports hmac,
    base64 and random, ~1 ms of every `run`'s start for one line."""
    return os.urandom(nbytes).hex()


def mint_spawn_secret() -> str:
    return random_hex(32)


def expected_variable() -> str:
    """The variable a `run` puts its gate's token in before it knows its host agent's: that
    agent's setting, when the environment shares it, else the default. A wrong guess costs only
    the commit at grant: the grant is then a reservation naming the agent's variable."""
    return os.environ.get(VARIABLE_ENV) or DEFAULT_VARIABLE


def spawn_token_for(secret: str) -> str:
    """32 lowercase hex characters, the form of every spawn token (128 bits of a SHA-256)."""
    return hashlib.sha256(_DOMAIN + secret.encode()).hexdigest()[:32]
