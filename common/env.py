"""The environment variables `holdfast run` gives CMD and that holdfast reads back (`put`, `handle`,
`exec`, the client library), named once (docs/design.md §5). The spawn token's variable is the
agent's setting (common/spawn_tokens.py).

Guarantee: what only the grant tells (FENCE, PROVIDER, PROVIDER_HANDLE) is always set, empty before
the grant, so a value inherited from an enclosing run never leaks into a nested one.
"""

from __future__ import annotations

SESSION = "HOLDFAST_SESSION"
COORDINATOR = "HOLDFAST_COORDINATOR"
GRANT_FILE = "HOLDFAST_GRANT_FILE"
GUARDS = "HOLDFAST_GUARDS"  # the guarded stores' URLs, one a line
FENCE = "HOLDFAST_FENCE"
PROVIDER = "HOLDFAST_PROVIDER"
PROVIDER_HANDLE = "HOLDFAST_PROVIDER_HANDLE"  # the newest handle of the chain, to resume from
HOST_ID = "HOLDFAST_HOST_ID"
TLS_DIR = "HOLDFAST_TLS_DIR"
# A session pod's enrollment (docs/tenants.md, Session pods); the agent reads the same names.
ENROLL = "HOLDFAST_ENROLL"                        # the issuer's host:port: enroll for client.pem
ENROLL_CA = "HOLDFAST_ENROLL_CA"                  # the CA of the issuer's server certificate
ENROLL_SERVER_NAME = "HOLDFAST_ENROLL_SERVER_NAME"  # the name in it, when not the address's host
TOKEN_FILE = "HOLDFAST_TOKEN_FILE"                # the projected ServiceAccount token (audience holdfast)
