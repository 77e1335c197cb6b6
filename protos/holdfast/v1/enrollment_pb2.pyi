from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EnrollRequest(_message.Message):
    __slots__ = ("csr_pem", "token")
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    token: str
    def __init__(self, csr_pem: _Optional[bytes] = ..., token: _Optional[str] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_bundle_pem", "node", "not_after_unix")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_UNIX_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_bundle_pem: bytes
    node: str
    not_after_unix: int
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_bundle_pem: _Optional[bytes] = ..., node: _Optional[str] = ..., not_after_unix: _Optional[int] = ...) -> None: ...

class EnrollSessionRequest(_message.Message):
    __slots__ = ("csr_pem", "token", "node")
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    token: str
    node: str
    def __init__(self, csr_pem: _Optional[bytes] = ..., token: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class EnrollSessionResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_bundle_pem", "tenant", "spiffe_id", "not_after_unix")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_UNIX_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_bundle_pem: bytes
    tenant: str
    spiffe_id: str
    not_after_unix: int
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_bundle_pem: _Optional[bytes] = ..., tenant: _Optional[str] = ..., spiffe_id: _Optional[str] = ..., not_after_unix: _Optional[int] = ...) -> None: ...
