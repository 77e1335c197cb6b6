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

The names are loaded when first used: `holdfast run` imports this package's modules, not the
public API's (~4.5 ms of every start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from holdfast.client.aio import AsyncConnection as AsyncConnection
    from holdfast.client.aio import AsyncRun as AsyncRun
    from holdfast.client.aio import RunOptions as RunOptions
    from holdfast.client.aio import asession as asession
    from holdfast.client.errors import BadInput as BadInput
    from holdfast.client.errors import ClientError as ClientError
    from holdfast.client.errors import OwnershipUnknown as OwnershipUnknown
    from holdfast.client.errors import PermissionDenied as PermissionDenied
    from holdfast.client.errors import SessionHeld as SessionHeld
    from holdfast.client.errors import StaleFence as StaleFence
    from holdfast.client.errors import Unavailable as Unavailable
    from holdfast.client.grant import Grant as Grant
    from holdfast.client.results import FencedValue as FencedValue
    from holdfast.client.results import Holder as Holder
    from holdfast.client.results import ProviderHandle as ProviderHandle
    from holdfast.client.results import Record as Record
    from holdfast.client.sync import Connection as Connection
    from holdfast.client.sync import Run as Run
    from holdfast.client.sync import session as session
    from holdfast.common.reasons import Reason as Reason

__all__ = [
    "AsyncConnection", "AsyncRun", "BadInput", "ClientError", "Connection", "FencedValue", "Grant", "Holder",
    "OwnershipUnknown", "PermissionDenied", "ProviderHandle", "Reason", "Record", "Run", "RunOptions",
    "SessionHeld", "StaleFence", "Unavailable", "asession", "session",
]
# Where the public names are defined, searched in this order.
SOURCES = ("holdfast.client.aio", "holdfast.client.sync", "holdfast.client.results", "holdfast.client.errors",
           "holdfast.client.grant", "holdfast.common.reasons")


def __getattr__(name: str) -> object:
    if name in __all__:
        for source in SOURCES:
            found = getattr(importlib.import_module(source), name, None)
            if found is not None:
                globals()[name] = found
                return found
    raise AttributeError(f"module 'holdfast.client' has no attribute {name!r}")
