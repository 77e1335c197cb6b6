"""The agent against real processes in this machine's PID namespace, over real gRPC."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status

from holdfast.agent import hostinfo
from holdfast.agent.service import HostAgentService
from holdfast.proc import cgroups
from holdfast.v1 import agent_pb2
from tests.integration.conftest import AgentProcess, attest, mint_token, probe, wait_carrier

P = agent_pb2.ProbeOutcome
VAR = "HOLDFAST_SPAWN_TOKEN"

HELPER_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *spin(void *arg) { (void)arg; for (;;) pause(); return 0; }
int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "rewrite") == 0) {
        puts("ready"); fflush(stdout);
        getchar();                           /* attested before the rewrite */
        char *t = getenv(argv[2]);           /* points into the block /proc/<pid>/environ shows */
        if (t) memset(t, '0', strlen(t));
        puts("rewritten"); fflush(stdout);
        for (;;) pause();
    }
    pthread_t th;
    pthread_create(&th, 0, spin, 0);
    puts("ready"); fflush(stdout);
    getchar();                               /* attested before the leader exits */
    pthread_exit(0);                         /* leader becomes Z while its thread runs */
}
"""


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("helper")
    (d / "helper.c").write_text(HELPER_C)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(d / "helper"), str(d / "helper.c")], check=True)
    return str(d / "helper")


def spawn(children: list, argv: list[str], token: str | None, extra: dict[str, str] | None = None,
          **kw: object) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], **(extra or {})}
    if token:
        env[VAR] = token
    p = subprocess.Popen(argv, env=env, **kw)  # type: ignore[call-overload]
    children.append(p)
    return p


def wait_state(pid: int, state: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = Path(f"/proc/{pid}/stat").read_bytes()
        if line[line.rfind(b")") + 2 :].startswith(state.encode()):
            return
        time.sleep(0.005)
    raise TimeoutError(f"pid {pid} never reached state {state}")


def error_of(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str, str]:
    status = rpc_status.from_call(exc)
    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo()
    assert status is not None and status.details[0].Unpack(info)
    return exc.code(), info.reason, exc.details()


def test_host_info_names_this_host(agent: AgentProcess) -> None:
    info = agent.stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)
    assert info.host_id == "host-local"
    assert info.incarnation.pid_ns == os.stat("/proc/self/ns/pid").st_ino
    assert info.incarnation.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert info.clock_ticks_per_second == os.sysconf("SC_CLK_TCK")
    assert info.can_enumerate and info.pidfs and info.spawn_token_env == VAR


def test_attest_then_alive_then_absent(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    child = spawn(children, ["sleep", "300"], token)
    identity = attest(agent.stub, token, pid_hint=child.pid)
    assert identity.pid == child.pid and identity.pidfd_ino and identity.spawn_token == token
    alive = probe(agent.stub, identity)
    assert alive.outcome == P.IDENTITY_MATCHED
    assert set(alive.matched_on) == {"pidfd", "start-time"}  # the token cannot change that: not read
    assert alive.answered_by_host_id == "host-local"
    without_pidfs = agent_pb2.ProcessIdentity()
    without_pidfs.CopyFrom(identity)
    without_pidfs.pidfd_ino = 0  # as attested on a kernel without pidfs: the token is read
    assert set(probe(agent.stub, without_pidfs).matched_on) == {"start-time", "token"}
    child.kill()
    child.wait()
    assert probe(agent.stub, identity).outcome == P.PID_ABSENT


def test_attest_falls_back_to_scan_and_finds_the_root_not_a_descendant(agent: AgentProcess,
                                                                       children: list) -> None:
    token = mint_token()
    root = spawn(children, ["sh", "-c", "sleep 300 & wait"], token)
    wait_carrier(agent.stub, token, want=2)
    # A wrong hint (a descendant that carries the token) must not be taken as the root.
    kids = [int(p) for p in Path(f"/proc/{root.pid}/task/{root.pid}/children").read_text().split()]
    assert attest(agent.stub, token, pid_hint=kids[0]).pid == root.pid
    assert attest(agent.stub, token).pid == root.pid
    scan = agent.stub.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5)
    assert {(c.pid, c.root) for c in scan.carriers} == {(root.pid, True), (kids[0], False)}


def test_attest_refuses_none_or_several_roots(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    with pytest.raises(grpc.RpcError) as none:
        attest(agent.stub, token)
    assert error_of(none.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "ATTESTATION_FAILED")
    spawn(children, ["sleep", "300"], token)
    spawn(children, ["sleep", "300"], token)
    with pytest.raises(grpc.RpcError) as two:
        attest(agent.stub, token)
    assert "2 tree roots" in error_of(two.value)[2]
    assert "attestation refused" in agent.log_path.read_text()
    assert token not in agent.log_path.read_text()  # tokens are never logged


@pytest.mark.parametrize("reaped", [False, True], ids=["zombie", "reaped"])
def test_a_root_that_exits_after_it_was_read_is_not_attested(children: list, reaped: bool) -> None:
    """The pidfd opened before the root's token and stat were read is what vouches for them (they
    are read once): a root that exits after those reads — a zombie, or reaped and its pid free for
    another process — is refused, and no cgroup made for it is left."""
    service = HostAgentService("host-local", hostinfo.gather(), VAR)
    token = mint_token()
    child = spawn(children, ["sleep", "300"], token)
    opened = asyncio.run(service.readers.run(service._root_of, token.encode(), child.pid))
    assert not isinstance(opened, str), opened
    pid, fd, stat = opened
    session = f"exit-test-{secrets.token_hex(4)}"
    try:
        child.kill()
        if reaped:
            child.wait()
        else:
            wait_state(pid, "Z")
        identity, why = service._attest_opened(pid, fd, stat, token, session, 1)
    finally:
        os.close(fd)
    assert identity is None and "exited during attestation" in why
    made = f"{cgroups.PREFIX}{session}-"
    assert not [d for _, dirs, _ in os.walk(service.cgroups.root) for d in dirs if d.startswith(made)]


def test_token_after_hundreds_of_kb_of_environment(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    big = {f"FILLER_{i}": "x" * 1000 for i in range(400)}
    big[VAR + "_EXTRA"] = mint_token()  # prefix collision must not match
    child = spawn(children, ["sleep", "300"], token, extra=big)
    wait_carrier(agent.stub, token)  # Popen returns before the execve has laid out the environ
    assert len(Path(f"/proc/{child.pid}/environ").read_bytes()) > 400_000
    assert attest(agent.stub, token).pid == child.pid
    other = spawn(children, ["sleep", "300"], None, extra={VAR + "_EXTRA": token})
    scan = agent.stub.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5)
    assert [c.pid for c in scan.carriers] == [child.pid]
    assert other.pid not in [c.pid for c in scan.carriers]


def test_exec_with_new_environment_is_not_death(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    child = spawn(children, ["sh", "-c", "read go; exec env -i sleep 300"], token, stdin=subprocess.PIPE)
    identity = attest(agent.stub, token, child.pid)
    child.stdin.write(b"go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 5
    cmdline = Path(f"/proc/{child.pid}/cmdline")
    while not cmdline.read_bytes().startswith(b"sleep") and time.monotonic() < deadline:
        time.sleep(0.01)
    result = probe(agent.stub, identity)
    assert result.outcome == P.IDENTITY_MATCHED and "token" not in result.matched_on


def test_rewritten_environment_is_not_death(agent: AgentProcess, children: list, helper: str) -> None:
    token = mint_token()
    child = spawn(children, [helper, "rewrite", VAR], token, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    identity = attest(agent.stub, token, child.pid)
    child.stdin.write(b"\n")
    child.stdin.flush()
    assert child.stdout.readline() == b"rewritten\n"
    assert token.encode() not in Path(f"/proc/{child.pid}/environ").read_bytes()
    result = probe(agent.stub, identity)
    assert result.outcome == P.IDENTITY_MATCHED
    assert set(result.matched_on) == {"pidfd", "start-time"}


def test_zombie_is_exit_observed(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    child = spawn(children, ["sleep", "300"], token)
    identity = attest(agent.stub, token, child.pid)
    os.kill(child.pid, signal.SIGKILL)
    wait_state(child.pid, "Z")  # not reaped: Popen has not waited
    assert probe(agent.stub, identity).outcome == P.EXIT_OBSERVED


def test_zombie_leader_with_live_thread_is_not_dead(agent: AgentProcess, children: list, helper: str) -> None:
    token = mint_token()
    child = spawn(children, [helper, "leader"], token, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    identity = attest(agent.stub, token, child.pid)
    child.stdin.write(b"\n")
    child.stdin.flush()
    wait_state(child.pid, "Z")
    # Its live thread still carries the token: the tree is not gone either.
    scan = agent.stub.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5)
    assert [c.pid for c in scan.carriers] == [child.pid]
    result = probe(agent.stub, identity)
    assert result.outcome == P.IDENTITY_MATCHED, result
    child.kill()
    child.wait()
    assert probe(agent.stub, identity).outcome in (P.PID_ABSENT, P.EXIT_OBSERVED)


def test_watch_exits_delivers_kill_9_and_remembers_it(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    child = spawn(children, ["sleep", "300"], token)
    identity = attest(agent.stub, token, child.pid)
    stream = agent.stub.WatchExits(agent_pb2.WatchExitsRequest(owners=[identity]), timeout=10)
    armed = next(stream)
    assert armed.armed and not armed.HasField("identity")  # every watch in place: kill now
    os.kill(child.pid, signal.SIGKILL)
    event = next(stream)
    assert event.identity == identity
    assert event.result.outcome == P.EXIT_OBSERVED
    child.wait()
    # Reaped and gone from /proc, yet the remembered exit (keyed by identity) answers first.
    assert probe(agent.stub, identity).outcome == P.EXIT_OBSERVED


def test_an_exit_asked_with_its_tree_comes_with_the_trees_proof(agent: AgentProcess, children: list) -> None:
    """WatchExits with check_tree: the exit event's result carries the tree check ProbeOwners would
    give — gone for a lone root, not gone while a descendant carrying the token lives."""
    def exit_event(argv: list[str], stdout: int | None = None) -> tuple[agent_pb2.ExitEvent, int]:
        token = mint_token()
        root = spawn(children, argv, token, stdout=stdout)
        said = root.stdout.readline() if stdout is not None else b""  # the child runs: it said so
        identity = attest(agent.stub, token, root.pid)
        stream = agent.stub.WatchExits(agent_pb2.WatchExitsRequest(owners=[identity], check_tree=True),
                                       timeout=10)
        assert next(stream).armed
        os.kill(root.pid, signal.SIGKILL)
        event = next(stream)
        root.wait()
        return event, int(said) if said else 0

    lone, _ = exit_event(["sleep", "300"])
    assert lone.result.outcome == P.EXIT_OBSERVED and lone.result.tree_checked and lone.result.tree_gone
    parent, child = exit_event(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE)
    try:
        assert parent.result.outcome == P.EXIT_OBSERVED
        assert parent.result.tree_checked and not parent.result.tree_gone, parent.result
    finally:
        os.kill(child, signal.SIGKILL)


def test_misrouted_and_other_pid_namespace_are_indeterminate(agent: AgentProcess, children: list) -> None:
    token = mint_token()
    child = spawn(children, ["sleep", "300"], token)
    identity = attest(agent.stub, token, child.pid)
    elsewhere = agent_pb2.ProcessIdentity()
    elsewhere.CopyFrom(identity)
    elsewhere.host_id = "another-host"
    result = probe(agent.stub, elsewhere)
    assert result.outcome == P.INDETERMINATE and "misrouted" in result.reason
    other_ns = agent_pb2.ProcessIdentity()
    other_ns.CopyFrom(identity)
    other_ns.incarnation.pid_ns += 1
    assert probe(agent.stub, other_ns).outcome == P.INDETERMINATE


def test_unprivileged_agent_scan_is_incomplete(tmp_path: Path, children: list) -> None:
    shared = Path(tempfile.mkdtemp(prefix="holdfast-nobody-"))  # pytest's tmp is root-only
    shared.chmod(0o777)
    token = mint_token()
    spawn(children, ["sleep", "300"], token)  # a root process the agent may not read
    agent = AgentProcess(shared, "host-nobody",
                         prefix=["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"])
    try:
        scan = agent.stub.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token=token), timeout=5)
        assert scan.enumerable and not scan.complete and scan.unreadable > 0
        assert not scan.carriers  # could not look: not an empty "nobody carries it"
    finally:
        agent.stop()
        shutil.rmtree(shared)


@pytest.mark.parametrize(
    ("request_fn", "needle"),
    [
        (lambda s, i: s.ProbeOwners(agent_pb2.ProbeOwnersRequest(owners=[i(pid=0)])), "pid must be"),
        (lambda s, i: s.ProbeOwners(agent_pb2.ProbeOwnersRequest(owners=[i(spawn_token="XYZ")])), "32 lower"),
        (lambda s, i: s.ProbeOwners(agent_pb2.ProbeOwnersRequest(owners=[i(host_id="")])), "host_id"),
        (lambda s, i: s.ProbeOwners(agent_pb2.ProbeOwnersRequest()), "empty"),
        (lambda s, i: s.ProbeOwners(agent_pb2.ProbeOwnersRequest(owners=[i()] * 1025)), "exceeds"),
        (lambda s, i: s.ScanSpawnToken(agent_pb2.ScanSpawnTokenRequest(spawn_token="ab")), "32 lowercase"),
        (lambda s, i: s.AttestSpawn(agent_pb2.AttestSpawnRequest()), "32 lowercase"),
        (lambda s, i: s.KillOwner(agent_pb2.KillOwnerRequest()), "owner is missing"),
        (lambda s, i: next(s.WatchExits(agent_pb2.WatchExitsRequest(owners=[i(pid=0)]))), "pid must be"),
    ],
)
def test_malformed_requests_are_invalid_argument(agent: AgentProcess, request_fn, needle: str) -> None:
    info = agent.stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5)

    def ident(**kw: object) -> agent_pb2.ProcessIdentity:
        base = {"host_id": "host-local", "incarnation": info.incarnation, "pid": 1, "start_ticks": 1}
        return agent_pb2.ProcessIdentity(**{**base, **kw})

    with pytest.raises(grpc.RpcError) as err:
        request_fn(agent.stub, ident)
    code, reason, message = error_of(err.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert needle in message
    # Nothing crashed: the agent still answers.
    assert agent.stub.GetHostInfo(agent_pb2.GetHostInfoRequest(), timeout=5).host_id == "host-local"


def test_health_reflection_and_sigterm_drain(agent: AgentProcess) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(agent.channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service="holdfast.v1.HostAgent"), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(agent.channel)
    answer = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=5))
    assert "holdfast.v1.HostAgent" in {s.name for s in answer.list_services_response.service}
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(10) == 0
    log = (Path(agent.log_path)).read_text()
    assert '"msg": "draining"' in log and '"msg": "stopped"' in log
