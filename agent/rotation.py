"""An enrolled agent's certificate over its life: enroll before serving, renew at 2/3, swap in place.

Guarantee: the agent serves only with a certificate the issuer signed for its own node; renewal
happens at two thirds of the lifetime with a fresh projected token, and a renewed pair is taken by
the running server's next handshake (holdfast.common.reloading) and by the next registration
channel, so no call fails and nothing restarts. A failed renewal keeps the old, still valid pair,
counts `holdfast_certificate_renewals_total{outcome="failed"}` and retries, ever sooner as expiry
nears; the alert on that counter and on the expiry gauge gives an operator the hours in between.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from prometheus_client import Counter

from holdfast.agent import enroll
from holdfast.common import tls
from holdfast.common.reloading import ReloadingCredentials
from holdfast.common.tls import Role

log = logging.getLogger("holdfast.agent.rotation")
RENEWALS = Counter("holdfast_certificate_renewals", "Certificate enrollments and renewals, by outcome",
                   ["outcome"])
MIN_RETRY_SECONDS = 5.0
MAX_RETRY_SECONDS = 300.0
# At start-up an issuer that does not answer yet (coordinators still starting, as after a cluster
# restart) is waited for this long; a refusal is final at once: retrying cannot change a verdict.
START_WAIT_SECONDS = 300.0
START_RETRY_FIRST_SECONDS = 1.0
START_RETRY_MAX_SECONDS = 30.0
UNANSWERED = ("", "ISSUER_UNAVAILABLE")  # no ErrorInfo: no answer at all (connection, deadline)


@dataclass(frozen=True)
class Enroller:
    target: str            # the issuer's enrollment listener, host:port
    server_ca: Path        # the CA its server certificate chains to (ca.pem)
    node: str
    token_file: Path
    tls_dir: Path
    server_name: str = ""  # the name in the issuer's certificate when the target's host is not it

    @property
    def cert_path(self) -> Path:
        return tls.files_dir(self.tls_dir) / f"{Role('agent', self.node).file_stem}.pem"

    async def enroll_once(self) -> Path:
        token = self.token_file.read_text().strip()
        creds = await enroll.enroll(self.target, tls.read_file(self.server_ca), self.node, token,
                                    self.server_name)
        path = enroll.write(self.tls_dir, self.node, creds)
        log.info("certificate enrolled", extra={"fields": {"node": self.node, "issuer": self.target}})
        return path


def due_in(cert_path: Path) -> float | None:
    """Seconds until renewal is due, or None when there is no usable certificate at all."""
    try:
        pem = tls.read_file(cert_path)
        cert = x509.load_pem_x509_certificate(pem)
    except (OSError, ValueError):
        return None
    if cert.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
        return None
    return enroll.renew_after(pem)


async def ensure(enroller: Enroller) -> None:
    """Enrolls unless a valid certificate not yet due for renewal is there; raises EnrollmentFailed."""
    due = due_in(enroller.cert_path)
    if due is not None and due > 0 and (enroller.tls_dir / f"{enroller.cert_path.stem}.key").exists():
        return
    try:
        await enroller.enroll_once()
    except (enroll.EnrollmentFailed, OSError):
        RENEWALS.labels("failed").inc()
        raise
    RENEWALS.labels("ok").inc()


async def ensure_waiting(enroller: Enroller, wait_seconds: float = START_WAIT_SECONDS) -> None:
    """`ensure`, retrying with backoff while the issuer does not answer, up to `wait_seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    delay = START_RETRY_FIRST_SECONDS
    while True:
        try:
            await ensure(enroller)
            return
        except enroll.EnrollmentFailed as exc:
            if exc.reason not in UNANSWERED or loop.time() + delay > deadline:
                raise
            log.warning("enrollment issuer did not answer; retrying", extra={"fields": {
                "issuer": enroller.target, "error": str(exc)[:300], "retry_s": delay}})
        await asyncio.sleep(delay)
        delay = min(delay * 2, START_RETRY_MAX_SECONDS)


async def renew_forever(enroller: Enroller, credentials: ReloadingCredentials) -> None:
    """Runs until cancelled."""
    while True:
        due = due_in(enroller.cert_path)
        await asyncio.sleep(max(due or 0.0, 0.0))
        try:
            await enroller.enroll_once()
        except (enroll.EnrollmentFailed, OSError) as exc:
            RENEWALS.labels("failed").inc()
            left = credentials.material.not_after - datetime.datetime.now(datetime.UTC).timestamp()
            retry = min(MAX_RETRY_SECONDS, max(MIN_RETRY_SECONDS, left / 20))
            log.error("certificate renewal failed; keeping the current one", extra={"fields": {
                "error": str(exc)[:300], "seconds_left": int(left), "retry_s": retry}})
            await asyncio.sleep(retry)
            continue
        RENEWALS.labels("ok").inc()
        credentials.reload()
