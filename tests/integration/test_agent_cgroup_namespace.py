"""The agent's view of cgroups decides whether it can make session cgroups: in a private cgroup
namespace (a pod's default) it cannot address other processes' cgroups and must say so, per
attestation; joined to the node's namespace (--node-cgroup-namespace) it can.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2
from tests.integration.conftest import AgentProcess, descendants, mint_token, wait_carrier, wait_empty

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0 or not cgroups.capability().able,
                                                   reason="needs root and cgroup v2 in the node's namespace")]
VAR = "HOLDFAST_SPAWN_TOKEN"


@pytest.fixture
def pod_cgroup() -> Iterator[Path]:
    """A cgroup standing in for a pod's: the agent is moved into it, then unshares its namespace."""
    path = Path(cgroups.cgroup2_root()) / f"pod-test-{secrets.token_hex(4)}"
    path.mkdir()
    yield path
    (path / "cgroup.kill").write_text("1")
    wait_empty(path)
    cgroups.sweep(cgroups.capability(), grace=0)
    path.rmdir()


# A node of its own: PID 1 (a shell waiting on its child) stays in the machine's cgroup namespace,
# as a node's init does; the agent is moved into the pod's cgroup and unshares its namespace there,
# as a pod's container is. (This machine's own PID 1 may not be inspected, hence the PID namespace.)
NODE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", 'sh -c "$@" & wait',
        "node", 'echo $$ > "$0/cgroup.procs" && exec unshare --cgroup "$@"')


def agent_in_pod(tmp: Path, pod: Path, host_id: str, *args: str) -> AgentProcess:
    # `unshare --fork` blocks SIGTERM while it waits for its child (a plain stop waited out its 10 s
    # timeout); SIGKILL of it ends the node's PID 1 through --kill-child, and the node with it.
    return AgentProcess(tmp, host_id, prefix=[*NODE, str(pod)], args=args, stop_signal=signal.SIGKILL)


def spawn_in_node(agent: AgentProcess, token: str) -> subprocess.Popen[bytes]:
    """A process of the agent's node: in its PID namespace, in the machine's cgroup namespace."""
    node_init = descendants(agent.proc.pid)[0]
    return subprocess.Popen(["nsenter", "--target", str(node_init), "--pid", "--mount", "--",
                             "env", f"{VAR}={token}", "sleep", "300"])


def attest(agent: AgentProcess, token: str) -> agent_pb2.ProcessIdentity:
    request = agent_pb2.AttestSpawnRequest(spawn_token=token, session_id="ns-test-session", fence=1)
    return agent.stub.AttestSpawn(request, timeout=10).identity


def test_a_private_cgroup_namespace_is_said_and_joining_the_nodes_fixes_it(tmp_path: Path,
                                                                           pod_cgroup: Path) -> None:
    private = agent_in_pod(tmp_path, pod_cgroup, "host-private")
    try:
        info = private.stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
        assert not info.session_cgroups and "private cgroup namespace" in info.session_cgroups_reason
        token = mint_token()
        child = spawn_in_node(private, token)
        wait_carrier(private.stub, token)
        identity = attest(private, token)
        assert not identity.cgroup.path and identity.tree_proof == agent_pb2.SCAN_ONLY
        assert "private cgroup namespace" in identity.tree_proof_reason
    finally:
        private.stop()  # --kill-child: its node's PID namespace ends, the child with it
        child.wait(10)
    joined = agent_in_pod(tmp_path, pod_cgroup, "host-joined", "--node-cgroup-namespace")
    try:
        info = joined.stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
        assert info.session_cgroups, info.session_cgroups_reason
        token = mint_token()
        child = spawn_in_node(joined, token)
        wait_carrier(joined.stub, token)
        identity = attest(joined, token)
        assert os.path.basename(identity.cgroup.path).startswith("holdfast-ns-test-session-1-")
        assert identity.tree_proof == agent_pb2.CGROUP_AND_SCAN
        assert Path(identity.cgroup.path, "cgroup.procs").read_text().split(), "the root was moved in"
    finally:
        joined.stop()
        child.wait(10)
