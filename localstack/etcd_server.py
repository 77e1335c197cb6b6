"""A real etcd process on free private loopback ports, for tests and `holdfast up`.

Guarantee: `start()` returns only once etcd answers its health endpoint; the server always runs
with auto-compaction and a backend quota (3.4's defaults compact nothing and stop at 2 GB with
NOSPACE); `stop()` ends exactly the process it started, by pid. A cluster member (`name`,
`initial_cluster`) is launched with `launch()` and judged healthy only once its cluster has a leader.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from holdfast.common import files

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
    fast_election: bool = False  # single member only: ~0.1 s start-up (docs/design.md §8)
    name: str = "holdfast"
    initial_cluster: str = ""  # "name=peer-url,..." for a cluster member; empty: a cluster of one
    # Heartbeat/election ms for a cluster member; 3 members on 2 loaded cores churn below 50/500.
    election_ms: tuple[int, int] | None = None
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

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def start(self, timeout: float = 15.0) -> EtcdServer:
        self.launch()
        return self.wait_healthy(timeout)

    def launch(self) -> EtcdServer:
        """Starts the process without waiting: a cluster member is healthy only with its peers."""
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            ETCD_BINARY,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://{self.host}:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://{self.host}:{self.peer_port}",
            "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
            "--quota-backend-bytes", str(self.quota_bytes),
            "--log-level", "error",
            *self._tls_flags(),
        ]
        if self.fast_election:
            cmd += ["--heartbeat-interval=10", "--election-timeout=100"]
        elif self.election_ms:
            heartbeat, election = self.election_ms
            cmd += [f"--heartbeat-interval={heartbeat}", f"--election-timeout={election}"]
        # Never through a link, nor into another user's file: `up` runs this as root in a state dir.
        log = files.open_private_file(None, str(self.data_dir / "etcd.log"), files.APPEND, 0o644)
        try:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        finally:
            os.close(log)
        return self

    def wait_healthy(self, timeout: float = 15.0) -> EtcdServer:
        assert self.process is not None, "launch() first"
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

    def is_leader(self) -> bool:
        """Whether this member leads its cluster now (maintenance status over the JSON gateway)."""
        req = urllib.request.Request(f"{self.url}/v3/maintenance/status", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                status = json.loads(resp.read())
        except OSError:
            return False
        leader = status.get("leader")
        return bool(leader) and leader == status.get("header", {}).get("member_id")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            stop_process(proc, timeout)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM a process this stack started, by its pid; SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
