"""The runtime client library: be a session's single writer from Python.

`Owner.start` + `Owner.supervise` (or `run`) is `holdfast run`; `Client` has a public method for
every Coordinator RPC; a `Grant` is what every owner write carries. See docs/design.md §5 and §6.
"""

from holdfast.client.acquire import RunSpec
from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant
from holdfast.client.owner import Owner, run

__all__ = ["Client", "ClientError", "Grant", "Owner", "RunSpec", "run"]
