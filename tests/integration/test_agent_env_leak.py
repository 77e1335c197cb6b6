"""The agent leaks no environment content (docs/design.md §2): secrets planted in other processes'
environments — beside a spawn token, in a malformed value of the token variable itself, in a
look-alike variable — appear in no byte of any RPC answer or refusal, nor in any line of its log,
while every HostAgent RPC is driven against those very processes (real children in a simulated host).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import grpc
import pytest

from holdfast.v1 import agent_pb2 as apb
from tests.integration.conftest import mint_token, stub_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]
VAR = "HOLDFAST_SPAWN_TOKEN"


def test_no_rpc_answer_nor_log_line_carries_environment_content(simhosts, children, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host = simhosts("host-leak")
    stub = stub_for(host.agent_address)
    planted = {name: f"leak-{name.lower()}-{secrets.token_hex(12)}"
               for name in ("API_KEY", "MALFORMED_TOKEN", "LOOKALIKE", "TREE_CHILD")}
    token = mint_token()
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    # The owner tree: a root and a descendant, both carrying the token and a secret beside it.
    owner = host.spawn(["sh", "-c", "sleep 300 & exec sleep 300"],
                       env={**base, VAR: token, "API_KEY": planted["API_KEY"],
                            "CHILD_SECRET": planted["TREE_CHILD"]})
    # Strangers: the token variable holding a secret that is no token, and a look-alike variable.
    strangers = [host.spawn(["sleep", "300"], env={**base, VAR: planted["MALFORMED_TOKEN"]}),
                 host.spawn(["sleep", "300"], env={**base, f"{VAR}_X": planted["LOOKALIKE"],
                                                   "X": planted["API_KEY"]})]
    children.extend([owner, *strangers])
    pid = host.host_pid(owner)
    for proc in strangers:
        host.host_pid(proc)

    answers: list[bytes] = []

    def keep(message) -> None:  # type: ignore[no-untyped-def]
        answers.append(message.SerializeToString())
        answers.append(str(message).encode())

    def keep_refusal(call, request) -> None:  # type: ignore[no-untyped-def]
        try:
            keep(call(request, timeout=10))
        except grpc.RpcError as exc:
            answers.append((exc.details() or "").encode())  # type: ignore[attr-defined]
            for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
                answers.append(value if isinstance(value, bytes) else f"{key}={value}".encode())

    keep(stub.GetHostInfo(apb.GetHostInfoRequest(), timeout=10))
    for scanned in (token, mint_token()):
        keep(stub.ScanSpawnToken(apb.ScanSpawnTokenRequest(spawn_token=scanned), timeout=10))
    identity = stub.AttestSpawn(apb.AttestSpawnRequest(spawn_token=token, pid_hint=pid), timeout=10).identity
    keep(identity)
    keep_refusal(stub.AttestSpawn, apb.AttestSpawnRequest(spawn_token=mint_token()))  # no carrier: refused
    keep_refusal(stub.ScanSpawnToken, apb.ScanSpawnTokenRequest(spawn_token=planted["MALFORMED_TOKEN"]))
    roots = stub.ListTokenRoots(apb.ListTokenRootsRequest(), timeout=10)
    keep(roots)
    assert [r.identity.pid for r in roots.roots] == [pid]  # the malformed value is nobody's token
    keep(stub.ProbeOwners(apb.ProbeOwnersRequest(owners=[identity], check_tree=True), timeout=10))
    watch = stub.WatchExits(apb.WatchExitsRequest(owners=[identity]), timeout=30)
    keep(next(watch))  # armed: the watch is in place before the kill
    killed = stub.KillOwner(apb.KillOwnerRequest(owner=identity, wait_seconds=10), timeout=30)
    keep(killed)
    assert killed.result.tree_gone, killed
    for event in watch:
        keep(event)
        break
    keep(stub.ProbeOwners(apb.ProbeOwnersRequest(owners=[identity], check_tree=True), timeout=10))

    log = (tmp_path / "host-leak" / "agent-host-leak.log").read_bytes()
    assert b"killed owner tree" in log and b"attestation refused" in log  # the log was written
    for name, secret in planted.items():
        for blob in answers:
            assert secret.encode() not in blob, f"{name} leaked in an RPC answer"
        assert secret.encode() not in log, f"{name} leaked in the agent's log"
    # The one environment value the agent may state is the token it was asked about, as designed.
    assert any(token.encode() in blob for blob in answers)
