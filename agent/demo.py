"""`holdfast agent demo`: start a real agent on loopback, print this host's identity, spawn a
child carrying a freshly minted token, and print the agent's attestation and probes of it
(alive, then dead after the child is killed). Everything it starts, it stops.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict

from holdfast.v1 import agent_pb2, agent_pb2_grpc


def _show(title: str, message) -> None:
    print(f"== {title}")
    print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2))


def run(spawn_token_env: str) -> int:
    with tempfile.TemporaryDirectory(prefix="holdfast-demo-") as tmp:
        ready = Path(tmp) / "ready.json"
        agent = subprocess.Popen(
            [sys.executable, "-m", "holdfast.cli", "agent", "serve",
             "--listen", "127.0.0.1:0", "--host-id", os.uname().nodename,
             "--spawn-token-env", spawn_token_env, "--ready-file", str(ready)],
            stderr=subprocess.DEVNULL,
        )
        child = None
        try:
            deadline = time.monotonic() + 15
            while not ready.exists():
                if agent.poll() is not None or time.monotonic() > deadline:
                    print("agent did not start", file=sys.stderr)
                    return 1
                time.sleep(0.02)
            address = json.loads(ready.read_text())["address"]
            with grpc.insecure_channel(address) as channel:
                stub = agent_pb2_grpc.HostAgentStub(channel)
                info = stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
                _show(f"host (agent at {address})", info)
                # The coordinator mints tokens in the product's flow; the demo plays that part.
                token = secrets.token_hex(16)
                child = subprocess.Popen(["sleep", "300"], env={**os.environ, spawn_token_env: token})
                attest = agent_pb2.AttestSpawnRequest(spawn_token=token, pid_hint=child.pid)
                identity = stub.AttestSpawn(attest, timeout=5).identity
                _show(f"attested identity of child pid {child.pid}", identity)
                probe = agent_pb2.ProbeOwnersRequest(owners=[identity], check_tree=True)
                _show("probe while alive", stub.ProbeOwners(probe, timeout=5).results[0])
                child.kill()
                child.wait()
                _show("probe after kill -9", stub.ProbeOwners(probe, timeout=5).results[0])
            return 0
        finally:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
            agent.terminate()
            agent.wait(10)
