"""A session pod's own certificate: with HOLDFAST_ENROLL set, a runtime command gets `client.pem`
from the enrollment issuer with the pod's projected ServiceAccount token, and `run` renews it while
it runs (docs/tenants.md, Session pods).

Guarantee: the key is made in this process and written only into the TLS directory (0600), opened
once through no link another user made or could swap (certs.open_enrolled_dir), never sent; what
the issuer signed is installed only if it is a client certificate of one tenant for that very key.
Key, certificate and trust bundle are each replaced whole by rename, one enrolling process at a
time (a lock file beside them), and a reader takes key and certificate only as a matching pair
(`credentials`). A certificate is used while it is valid; `run` renews at two thirds of its
validity and opens its later calls' channel with the new pair (Client.renewed), so a run keeps its
grant across renewals; a failed renewal keeps the current pair and is retried, sooner as its end
nears.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from holdfast.client.errors import ClientError
from holdfast.common import certs, env, files, reloading, tls
from holdfast.common.reasons import Reason, reason_of
from holdfast.common.retry import retrying
from holdfast.v1 import enrollment_pb2 as pb
from holdfast.v1 import enrollment_pb2_grpc as pb_grpc

DEFAULT_TOKEN_FILE = "/var/run/secrets/holdfast/token"
ENROLL_TIMEOUT_S = 15.0
# An issuer that does not answer (coordinators restarting under a pod's start) is asked again for
# this long; a refusal is final at once: retrying cannot change a verdict.
START_BUDGET_S = 30.0
RENEW_AT = 2 / 3
MIN_RETRY_S = 1.0
MAX_RETRY_S = 300.0
ROLE = tls.Role("client")
LOCK_FILE = ".enroll.lock"
UNANSWERED = ("", "ISSUER_UNAVAILABLE")  # no ErrorInfo: no answer at all (connection, deadline)


def due_in(cert_pem: bytes, now: float | None = None) -> float:
    """Seconds until a certificate is due for renewal (≤ 0: now): two thirds into its validity."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
    return start + (end - start) * RENEW_AT - (time.time() if now is None else now)


def check_signed(cert_pem: bytes, key_pem: bytes) -> str:
    """The tenant of what the issuer signed, if it is a client certificate of one tenant for our key."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    role = tls.role_of_certificate(cert)
    if cert.public_key().public_bytes(der, spki) != key.public_key().public_bytes(der, spki):
        raise ClientError(Reason.ENROLLMENT_REFUSED, "the issuer signed another key than this pod's")
    if role is None or role.kind != "client" or not role.tenant:
        raise ClientError(Reason.ENROLLMENT_REFUSED, f"the issuer signed {role and role.uri()}, not a client "
                          "certificate of one tenant")
    return role.tenant


@dataclass(frozen=True)
class Enroller:
    """Where a session pod enrolls, with what, and where its certificate goes."""

    target: str          # the issuer's enrollment listener, host:port (HOLDFAST_ENROLL)
    server_ca: Path      # the CA its server certificate chains to (HOLDFAST_ENROLL_CA)
    token_file: Path     # the projected ServiceAccount token (HOLDFAST_TOKEN_FILE)
    tls_dir: Path        # where client.key, client.pem and ca.pem are written (HOLDFAST_TLS_DIR)
    node: str            # the node this pod says it runs on, checked by the issuer (HOLDFAST_HOST_ID)
    server_name: str = ""

    @classmethod
    def from_env(cls, tls_dir: Path | None, node: str) -> Enroller | None:
        """The enroller HOLDFAST_ENROLL asks for, or None when it is unset (certificates as mounted)."""
        target = os.environ.get(env.ENROLL, "")
        if not target:
            return None
        if tls_dir is None:
            raise ClientError(Reason.INVALID_ARGUMENT, f"{env.ENROLL} needs --tls-dir or {env.TLS_DIR}: the "
                              "writable directory (an emptyDir) where the pod's key and certificate go")
        ca = os.environ.get(env.ENROLL_CA) or str(tls_dir / "ca.pem")
        token = os.environ.get(env.TOKEN_FILE) or DEFAULT_TOKEN_FILE
        return cls(target, Path(ca), Path(token), tls_dir, node, os.environ.get(env.ENROLL_SERVER_NAME, ""))

    def material(self) -> reloading.Material | None:
        """The installed pair and trust bundle, or None when there is no valid matching pair. A pair
        read between another enroller's two renames is read again."""
        for _ in range(3):
            try:
                material = reloading.read_material(self.tls_dir, ROLE)
            except FileNotFoundError:
                return None
            except ValueError:
                continue  # caught between the key's rename and the certificate's
            return material if material.not_after > time.time() else None
        return None

    def credentials(self) -> grpc.ChannelCredentials:
        material = self.material()
        if material is None:
            raise ClientError(Reason.TLS_FILE_MISSING, f"no valid client certificate in {self.tls_dir}; "
                              f"it is enrolled for at {self.target}")
        return grpc.ssl_channel_credentials(root_certificates=material.trust_pem,
                                            private_key=material.key_pem, certificate_chain=material.cert_pem)

    async def ensure(self) -> None:
        """Enrolls unless a valid pair is installed (it may be due: `run`'s renewal takes care of
        that); an issuer that does not answer is asked again for START_BUDGET_S."""
        if self.material() is None:
            await retrying(lambda: self.renew(due_only=False), unanswered, budget_s=START_BUDGET_S)

    async def renew(self, due_only: bool = True) -> None:
        """Enrolls and installs a new pair, unless (under the lock) another process already installed
        one that is valid and, with `due_only`, not yet due."""
        # Every file written through one descriptor on the directory (certs.open_enrolled_dir); the
        # lock another user left there, or a link at its name, is refused, never opened.
        try:
            directory, _ = certs.open_enrolled_dir(self.tls_dir)
        except OSError as exc:
            raise self._unwritable(exc) from None
        try:
            try:
                fd = files.open_private_file(directory, LOCK_FILE, os.O_RDWR | os.O_CREAT)
            except OSError as exc:
                raise self._unwritable(exc) from None
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                current = self.material()
                if current is not None and (not due_only or due_in(current.cert_pem) > 0):
                    return
                await self._enroll(directory)
            finally:
                os.close(fd)  # and with it the lock
        finally:
            os.close(directory)

    def _unwritable(self, exc: OSError) -> ClientError:
        return ClientError(Reason.TLS_FILE_MISSING, f"cannot write the TLS directory {self.tls_dir}: {exc} "
                           f"({env.TLS_DIR} must lead through no link another user made or could swap)")

    async def _enroll(self, directory: int) -> None:
        try:
            token = self.token_file.read_text().strip()
            server_ca = tls.read_file(self.server_ca)
        except OSError as exc:
            raise ClientError(Reason.TLS_FILE_MISSING, f"cannot read what enrollment needs: {exc} (the "
                              f"token: {env.TOKEN_FILE}, the issuer's CA: {env.ENROLL_CA})") from None
        key_pem, csr_pem = certs.key_and_csr(ROLE)  # the issuer adds the tenant
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        async with grpc.aio.secure_channel(self.target, grpc.ssl_channel_credentials(server_ca),
                                           options=options) as channel:
            try:
                response = await pb_grpc.EnrollmentStub(channel).EnrollSession(
                    pb.EnrollSessionRequest(csr_pem=csr_pem, token=token, node=self.node),
                    timeout=ENROLL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                reason = reason_of(exc)
                what = f"{reason + ': ' if reason else ''}{exc.details() or exc.code().name}"
                failure = Reason.ENROLLMENT_UNAVAILABLE if reason in UNANSWERED else Reason.ENROLLMENT_REFUSED
                raise ClientError(failure, f"enrollment at {self.target}: {what}") from None
        check_signed(response.certificate_pem, key_pem)
        # The key first: a reader between the renames sees a mismatched pair and reads again.
        files.write_whole(directory, f"{ROLE.file_stem}.key", key_pem, 0o600)
        files.write_whole(directory, f"{ROLE.file_stem}.pem", response.certificate_pem, 0o644)
        files.write_whole(directory, "ca.pem", response.ca_bundle_pem, 0o644)

    async def renew_forever(self, renewed: Callable[[], Awaitable[None]],
                            say: Callable[[str], None]) -> None:
        """Runs until cancelled: renews when due, then `renewed()`; a failure is said and retried."""
        while True:
            current = self.material()
            await asyncio.sleep(max(due_in(current.cert_pem), 0.0) if current is not None else 0.0)
            try:
                await self.renew()
            except ClientError as err:
                left = current.not_after - time.time() if current is not None else 0.0
                retry = min(MAX_RETRY_S, max(MIN_RETRY_S, left / 20))
                say(f"certificate renewal failed ({err.reason}: {err.message}); keeping the current one "
                    f"({int(left)} s left), retrying in {retry:g} s")
                await asyncio.sleep(retry)
                continue
            await renewed()


def unanswered(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and exc.reason == Reason.ENROLLMENT_UNAVAILABLE

