"""A simulated host on one machine: its own PID namespace (`unshare --pid --fork --mount-proc`),
a small reaper as its PID 1, and a holdfast agent as the reaper's child listening on 127.0.0.N.

Processes of one simulated host are invisible to another, as on separate machines. `reboot()`
kills the reaper, which ends every process of the namespace, and starts a fresh namespace: a new
host incarnation, with no override flag anywhere. Needs root. Only loopback addresses are used.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from holdfast.client import grantdir
from holdfast.common import files

# PID 1 of the namespace: starts the agent, forwards SIGTERM/SIGINT to it, reaps every orphan,
# and exits with the agent's status (which ends the namespace).
REAPER = """
import os, signal, subprocess, sys
agent = subprocess.Popen(sys.argv[1:])
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda n, f: agent.send_signal(n))
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        sys.exit(0)
    except InterruptedError:
        continue
    if pid == agent.pid:
        sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], timeout: float) -> T:
    """The probe's first truthy value, polled every 5 ms; TimeoutError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def ns_pid(outer_pid: int) -> int:
    """The pid a process has in its own (innermost) PID namespace, from NSpid in its status."""
    for line in Path(f"/proc/{outer_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise LookupError(f"no NSpid for {outer_pid}")


class SimulatedHost:
    """One simulated host. `index` N gives it the address 127.0.0.N (tests choose disjoint N)."""

    def __init__(self, host_id: str, index: int, state_dir: str | os.PathLike[str],
                 agent_args: Sequence[str] = (), spawn_token_env: str = "HOLDFAST_SPAWN_TOKEN") -> None:
        if not 2 <= index <= 254:
            raise ValueError("index must be in 2..254 (127.0.0.1 is the real host)")
        self.host_id = host_id
        self.index = index
        self.ip = f"127.0.0.{index}"
        self.state_dir = Path(state_dir)
        self.agent_args = list(agent_args)
        self.spawn_token_env = spawn_token_env
        self._unshare: subprocess.Popen[bytes] | None = None
        self._namespace = 0  # the running namespace's nsfs inode (what `run` names its grant dirs for)
        self._ending_at = 0  # clock ticks since boot when it began to end (0: it has not)
        self._address = ""
        self.incarnations = 0  # how many namespaces this host has had

    @property
    def agent_address(self) -> str:
        if not self._address:
            raise RuntimeError(f"simulated host {self.host_id} is not running")
        return self._address

    @property
    def reaper_pid(self) -> int:
        """The namespace's PID 1, as seen from the machine's (outer) namespace."""
        if self._unshare is None:
            raise RuntimeError(f"simulated host {self.host_id} is not running")
        unshare = self._unshare.pid
        return wait_for("the reaper", lambda: (_children(unshare) or [0])[0], 5.0)

    @property
    def running(self) -> bool:
        return self._unshare is not None and self._unshare.poll() is None

    def start(self, timeout: float = 15.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ready = self.state_dir / f"agent-{self.host_id}-{self.incarnations}.json"
        ready.unlink(missing_ok=True)
        argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REAPER,
                sys.executable, "-m", "holdfast.cli", "agent", "serve",
                "--listen", f"{self.ip}:0", "--host-id", self.host_id,
                "--spawn-token-env", self.spawn_token_env, "--ready-file", str(ready), *self.agent_args]
        log = self.state_dir / f"agent-{self.host_id}.log"
        # Never through a link, nor into another user's file: `up` runs this as root in a state dir.
        out = files.open_private_file(None, str(log), files.APPEND, 0o644)
        try:
            self._unshare = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        finally:
            os.close(out)
        self.incarnations += 1
        try:
            wait_for(f"agent of {self.host_id}",
                      lambda: ready.exists() or self._unshare.poll() is not None, timeout)  # type: ignore[union-attr]
            if not ready.exists():
                raise RuntimeError(f"agent of {self.host_id} exited; see {log}")
        except BaseException:
            self._kill()
            raise
        self._address = json.loads(ready.read_text())["address"]
        self._namespace = os.stat(f"/proc/{self.reaper_pid}/ns/pid").st_ino

    def _ending(self) -> None:
        """Notes when this namespace began to end, before anything could end it: no process of a
        namespace made after it (given its freed inode at once) can have started earlier."""
        if not self._ending_at:
            self._ending_at = int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))

    def _kill(self) -> None:
        if self._unshare is None:
            return
        self._ending()
        if self._unshare.poll() is None:
            # SIGKILL to the namespace's PID 1 ends every process in it.
            for pid in _children(self._unshare.pid):
                os.kill(pid, signal.SIGKILL)
            try:
                self._unshare.wait(5)
            except subprocess.TimeoutExpired:
                self._unshare.kill()
                self._unshare.wait(5)
        self._unshare = None
        self._address = ""
        if self._namespace:
            # The grant dirs of runs killed inside (the namespace's end, a crash's SIGKILL): the next
            # run of a namespace sweeps them, and this one has none.
            grantdir.sweep_ended(self._namespace, self._ending_at)
        self._namespace = self._ending_at = 0

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the agent (it drains), then end the namespace and everything in it."""
        if self.running:
            self._ending()
            os.kill(self.reaper_pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._unshare.wait(timeout)  # type: ignore[union-attr]
        self._kill()

    def reboot(self, timeout: float = 15.0, settle: float = 0.3) -> None:
        """Kill the namespace outright (a crash, not a drain) and start a new one.

        `settle` lets the kernel release the dead namespace first (it does so asynchronously), so
        the new one usually reuses its nsfs inode, as consecutive namespaces do on a real host.
        """
        self._kill()
        time.sleep(settle)
        self.start(timeout)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **popen_kwargs: object) -> subprocess.Popen[bytes]:
        """Runs argv inside this host's namespace; the Popen is the outer `nsenter` waiting on it.
        A `cwd` is the working directory inside (entering the mount namespace resets it to /): set
        with --wdns, after entering; --wd kept the directory of the machine's namespace, which a
        process inside sees as "(unreachable)" in getcwd (Codex then fails to start)."""
        cwd = popen_kwargs.get("cwd")
        wd = [f"--wdns={cwd}"] if cwd else []
        cmd = ["nsenter", "--target", str(self.reaper_pid), "--pid", "--mount", *wd, "--", *argv]
        return subprocess.Popen(cmd, env=dict(env) if env is not None else None, **popen_kwargs)  # type: ignore[call-overload]

    def outer_pid(self, proc: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
        """The machine-namespace pid of a process started by spawn()."""
        return wait_for("the spawned process", lambda: (_children(proc.pid) or [0])[0], timeout)

    def host_pid(self, proc: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
        """The pid a process started by spawn() has inside this host (what its agent reports)."""
        return ns_pid(self.outer_pid(proc, timeout))

    def __enter__(self) -> SimulatedHost:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
