"""A role's certificate, key and CA bundle that follow their files: rotation without a restart.

Guarantee: a server built with `server_credentials()` presents, on every new TLS handshake, the
newest *consistent* key and certificate in the directory and trusts the newest CA bundle; a pair
whose key does not match its certificate (caught between two renames) is never served: the last
good pair stays until the files agree again. Connections already open keep their handshake, so a
swap fails no call. `channel_credentials()` gives the newest pair for a new outgoing channel.

The files are watched by a stat of their (inode, mtime, size) at most every POLL_SECONDS, done
from gRPC's handshake hook: no inotify thread to keep alive, works on the symlink swaps of a
Kubernetes secret volume (inotify on those is notoriously fragile), and costs three stats per
poll. `reload()` makes a change visible at once (the agent calls it after renewing). Every read is
tls.read_files's: another user's file, link or FIFO in the directory is refused (the last good
pair and bundle stay), never trusted nor waited on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import Gauge

from holdfast.common import tls

POLL_SECONDS = 5.0
log = logging.getLogger("holdfast.tls")
EXPIRY = Gauge("holdfast_certificate_expiry_seconds",
               "Seconds until this process's own certificate expires, by role kind", ["role"])


@dataclass(frozen=True)
class Material:
    key_pem: bytes
    cert_pem: bytes
    trust_pem: bytes
    not_after: float


def role_files(directory: Path, role: tls.Role) -> list[Path]:
    """The files a role's TLS credentials are read from: key, certificate, and the trust bundle's, in
    the directory they are in (tls.files_dir)."""
    where = tls.files_dir(directory)
    return [where / f"{role.file_stem}.key", where / f"{role.file_stem}.pem", where / "ca.pem",
            where / f"{tls.AGENT_CA_STEM}.pem", where / f"{tls.SESSION_CA_STEM}.pem"]


def files_stamp(paths: list[Path]) -> tuple[tuple[int, int, int], ...]:
    """(inode, mtime, size) of each file, zeros for a missing one: changes whenever one is replaced.
    A stat by path only tells when to read again, never what is taken: read_material refuses what
    another user could have put there."""
    out = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            out.append((0, 0, 0))
            continue
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


def read_material(directory: Path, role: tls.Role) -> Material:
    """The files as they are now (tls.read_files: none another user could have put or changed);
    ValueError when the key is not the certificate's."""
    read = tls.read_files(directory, role)
    cert = x509.load_pem_x509_certificate(read.cert_pem)
    key = serialization.load_pem_private_key(read.key_pem, password=None)
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, public):
        raise ValueError(f"{directory / (role.file_stem + '.key')} is not the key of its certificate")
    return Material(read.key_pem, read.cert_pem, read.trust_pem, cert.not_valid_after_utc.timestamp())


class ReloadingCredentials:
    def __init__(self, directory: Path, role: tls.Role, require_client_auth: bool = True) -> None:
        self.directory = directory
        self.role = role
        self.require_client_auth = require_client_auth
        self._paths = role_files(directory, role)
        self._lock = threading.Lock()
        self.material = read_material(directory, role)  # start-up: a bad pair is an error, not a wait
        self._stamp = files_stamp(self._paths)
        self._checked = time.monotonic()
        self.version = 1      # bumped on every change taken
        self.served = 0       # the version the server last handed to gRPC
        EXPIRY.labels(role.kind).set_function(lambda: self.material.not_after - time.time())

    def reload(self) -> bool:
        """Takes the files if they changed and agree; True when something new was taken."""
        with self._lock:
            self._checked = time.monotonic()
            stamp = files_stamp(self._paths)
            if stamp == self._stamp:
                return False
            try:
                material = read_material(self.directory, self.role)
            except (OSError, ValueError) as exc:
                log.warning("certificate files changed but are not usable yet; keeping the old ones",
                            extra={"fields": {"dir": str(self.directory), "error": str(exc)[:200]}})
                return False
            self._stamp = stamp
            if material == self.material:
                return False
            self.material = material
            self.version += 1
        log.info("certificate reloaded", extra={"fields": {"role": self.role.uri(), "version": self.version,
                                                           "not_after": int(material.not_after)}})
        return True

    def _config(self) -> grpc.ServerCertificateConfiguration:
        m = self.material
        self.served = self.version
        return grpc.ssl_server_certificate_configuration([(m.key_pem, m.cert_pem)],
                                                         root_certificates=m.trust_pem)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before each handshake: None keeps the current configuration.
        if time.monotonic() - self._checked >= POLL_SECONDS:
            self.reload()
        return self._config() if self.served != self.version else None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._config(), self._fetch,
                                                   require_client_authentication=self.require_client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if time.monotonic() - self._checked >= POLL_SECONDS:
            self.reload()
        m = self.material
        return grpc.ssl_channel_credentials(root_certificates=m.trust_pem, private_key=m.key_pem,
                                            certificate_chain=m.cert_pem)


def seconds_left(directory: Path, role: tls.Role) -> float:
    """For `doctor`: seconds until the role's certificate expires (negative: expired)."""
    cert = x509.load_pem_x509_certificate(tls.read_files(directory, role).cert_pem)
    return cert.not_valid_after_utc.timestamp() - time.time()
