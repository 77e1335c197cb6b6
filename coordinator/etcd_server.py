"""A real etcd process on free private loopback ports, for tests and `holdfast up`.

Guarantee: `start()` returns only once etcd answers its health endpoint; the server always runs
with auto-compaction and a backend quota (3.4's defaults compact nothing and stop at 2 GB with
NOSPACE); `stop()` ends exactly the process it started, by pid.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ETCD_BINARY = "/usr/bin/etcd"
DEFAULT_QUOTA_BYTES = 512 * 1024 * 1024


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdServer:
    data_dir: Path
    host: str = "127.0.0.1"
    fast_election: bool = False  # single member only: ~0.1 s start-up (DESIGN.md §8)
    quota_bytes: int = DEFAULT_QUOTA_BYTES
    client_port: int = 0
    peer_port: int = 0
    # etcd's own CA directory (`<tls dir>/etcd`): https only, and only certificates of that CA.
    tls_dir: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_dir else 'http'}://{self.host}:{self.client_port}"

    def _tls_flags(self) -> list[str]:
        if self.tls_dir is None:
            return []
        return ["--cert-file", str(self.tls_dir / "etcd.pem"), "--key-file", str(self.tls_dir / "etcd.key"),
                "--client-cert-auth", "--trusted-ca-file", str(self.tls_dir / "ca.pem")]

    def start(self, timeout: float = 15.0) -> EtcdServer:
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            ETCD_BINARY,
            "--name", "holdfast",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://{self.host}:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://{self.host}:{self.peer_port}",
            "--initial-cluster", f"holdfast=http://{self.host}:{self.peer_port}",
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
            "--quota-backend-bytes", str(self.quota_bytes),
            "--log-level", "error",
            *self._tls_flags(),
        ]
        if self.fast_election:
            cmd += ["--heartbeat-interval=10", "--election-timeout=100"]
        log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"etcd exited with {code}; see {self.data_dir}/etcd.log")
            if self.healthy():
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"etcd not healthy within {timeout}s")

    def healthy(self) -> bool:
        context = None
        if self.tls_dir is not None:
            context = ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))
            context.load_cert_chain(self.tls_dir / "coordinator.pem", self.tls_dir / "coordinator.key")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1, context=context) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
