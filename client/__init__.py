"""The runtime client library: be a session's single writer from Python, in async or sync form.

    from holdfast.client import session, StaleFence

    with session("fix-login", ["codex", "exec", "find why login fails"], takeover=True) as run:
        run.put("progress", b"started")   # fenced: StaleFence once another owner took over
        status = run.wait()               # CMD's exit status, once the grant is released

`asession` / `AsyncConnection` / `AsyncRun` are the same in async form (holdfast.client.aio); the
sync names run exactly those on a private event loop (holdfast.client.sync). Refusals raise the
typed ClientError of their reason's family; results are frozen dataclasses. docs/api.md documents
every name of `__all__`, the public surface; `Client` and `Owner` (holdfast.client.connection,
holdfast.client.owner) are the layer below it, which the CLI uses.
"""

from holdfast.client.aio import AsyncConnection, AsyncRun, RunOptions, asession
from holdfast.client.errors import (
    BadInput,
    ClientError,
    OwnershipUnknown,
    PermissionDenied,
    SessionHeld,
    StaleFence,
    Unavailable,
)
from holdfast.client.grant import Grant
from holdfast.client.results import FencedValue, Holder, ProviderHandle, Record
from holdfast.client.sync import Connection, Run, session
from holdfast.common.reasons import Reason

__all__ = [
    "AsyncConnection", "AsyncRun", "BadInput", "ClientError", "Connection", "FencedValue", "Grant", "Holder",
    "OwnershipUnknown", "PermissionDenied", "ProviderHandle", "Reason", "Record", "Run", "RunOptions",
    "SessionHeld", "StaleFence", "Unavailable", "asession", "session",
]
