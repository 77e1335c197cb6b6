"""An agent's own certificate, from the enrollment issuer: key made here, CSR and token sent there.

Guarantee: the private key is generated in this process and written only to this node's TLS
directory (0600), opened once through no link another user made or could swap and written through
that descriptor (certs.open_enrolled_dir); it never crosses the wire. Key, certificate and CA
bundle are each written whole by rename, the key first, so a reader never pairs a new certificate
with an old key. A certificate the issuer signed for another node than ours is refused here too,
and nothing is written.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from holdfast.common import certs, files
from holdfast.common.reasons import reason_of
from holdfast.common.tls import Role
from holdfast.v1 import enrollment_pb2 as pb
from holdfast.v1 import enrollment_pb2_grpc as pb_grpc

ENROLL_TIMEOUT_SECONDS = 15.0
# Renew at two thirds of the lifetime: a day's certificate is renewed with 8 h to spare, room for
# an issuer or API server outage long enough to page someone (the alert fires at 6 h).
RENEW_AT = 2 / 3


class EnrollmentFailed(Exception):
    """The issuer refused or could not be reached; `reason` is its ErrorInfo reason where it gave one."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}" if reason else message)
        self.reason = reason


@dataclass(frozen=True)
class Credentials:
    key_pem: bytes
    cert_pem: bytes
    bundle_pem: bytes


def new_key_and_csr(node: str) -> tuple[bytes, bytes]:
    """An EC P-256 key and a CSR asking for this node's agent role only."""
    return certs.key_and_csr(Role("agent", node))


async def request(target: str, server_ca_pem: bytes, csr_pem: bytes, token: str,
                  server_name: str = "") -> pb.EnrollResponse:
    """One Enroll call over server-auth TLS (we have no certificate to present yet)."""
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(server_ca_pem),
                                       options=options) as channel:
        try:
            return await pb_grpc.EnrollmentStub(channel).Enroll(
                pb.EnrollRequest(csr_pem=csr_pem, token=token), timeout=ENROLL_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            raise EnrollmentFailed(reason_of(exc), exc.details() or exc.code().name) from None


async def enroll(target: str, server_ca_pem: bytes, node: str, token: str,
                 server_name: str = "") -> Credentials:
    key_pem, csr_pem = new_key_and_csr(node)
    response = await request(target, server_ca_pem, csr_pem, token, server_name)
    if response.node != node:
        raise EnrollmentFailed("NODE_MISMATCH", f"the issuer signed for node {response.node!r}; this "
                               f"agent is {node!r} (HOLDFAST_HOST_ID must be the pod's spec.nodeName)")
    return Credentials(key_pem, response.certificate_pem, response.ca_bundle_pem)


def write(directory: Path, node: str, creds: Credentials) -> Path:
    """Installs the credentials as `agent-<node>.key/.pem` and ca.pem, through one descriptor on
    `directory` (certs.open_enrolled_dir: its `holdfast-<uid>` where others may write it); returns
    the certificate path."""
    stem = Role("agent", node).file_stem
    installed = ((f"{stem}.key", creds.key_pem, 0o600), (f"{stem}.pem", creds.cert_pem, 0o644),
                 ("ca.pem", creds.bundle_pem, 0o644))  # the key first
    fd, where = certs.open_enrolled_dir(directory)
    try:
        for name, data, mode in installed:
            files.write_whole(fd, name, data, mode, durable=True)
    finally:
        os.close(fd)
    return where / f"{stem}.pem"


def renew_after(cert_pem: bytes, now: datetime.datetime | None = None) -> float:
    """Seconds until a certificate is due for renewal (≤ 0: now)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    due = start + (end - start) * RENEW_AT
    return (due - (now or datetime.datetime.now(datetime.UTC))).total_seconds()

