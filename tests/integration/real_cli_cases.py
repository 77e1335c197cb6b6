"""The cases of test_real_clis.py, run by it inside a network namespace with only loopback up (this
file refuses to run anywhere else): the real Codex and Claude Code CLIs under `holdfast codex` and
`holdfast claude` on two simulated hosts, each host with a CLI state directory of its own (as two
machines have), the same working directory path on both, and the stub model server on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from holdfast.client import provider_rules as rules
from holdfast.localstack.simhost import SimulatedHost
from holdfast.v1 import coordinator_pb2 as pb
from tests.integration.conftest import descendants
from tests.integration.run_fixtures import Cluster, Run, until

pytest_plugins = ["tests.integration.coordinator_fixtures", "tests.integration.run_fixtures"]
pytestmark = [pytest.mark.timeout(180), pytest.mark.root]
ROOT = Path(__file__).resolve().parents[2]
CLIS = ROOT / "tests" / "clis"
BIN = CLIS / "node_modules" / ".bin"

if [name for _, name in socket.if_nameindex()] != ["lo"]:  # this network namespace's interfaces
    raise RuntimeError("real_cli_cases.py runs only inside a network namespace with nothing but loopback: "
                       "run tests/integration/test_real_clis.py")


@dataclass
class Stub:
    port: int
    log: Path

    def entries(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def held(self) -> list[str]:
        return [str(e["prompt"]) for e in self.entries() if "held" in e]

    def release(self) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/_release", method="POST")
        urllib.request.urlopen(request, timeout=10).read()


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[Stub]:
    ready, log = tmp_path / "stub.ready", tmp_path / "stub.log"
    proc = subprocess.Popen([sys.executable, str(CLIS / "stub_model.py"), str(ready), str(log)])
    try:
        until("the stub model server", lambda: ready.exists() or proc.poll() is not None)
        assert proc.poll() is None, "the stub model server exited"
        yield Stub(json.loads(ready.read_text())["port"], log)
    finally:
        proc.kill()
        proc.wait(10)


@dataclass
class Agent:
    """One CLI (`codex` or `claude`) as the tests drive it: a state directory per host."""

    name: str
    cluster: Cluster
    stub: Stub
    work: Path  # the working directory, the same path on every host

    @property
    def provider(self) -> rules.Provider:
        return rules.PROVIDERS[self.name]

    @property
    def home(self) -> Path:
        """HOME, the same path on every host, and each host's own (a tmpfs in its mount namespace)."""
        return self.cluster.tmp / "home"

    @property
    def state(self) -> Path:
        return self.home / self.provider.state_default

    def host(self, host_id: str) -> SimulatedHost:
        """A simulated host with a home of its own: a machine that never saw another's CLI state."""
        host = self.cluster.host(host_id)
        self.home.mkdir(exist_ok=True)
        mount = host.spawn(["mount", "-t", "tmpfs", "-o", "mode=0755", "home", str(self.home)])
        assert mount.wait(30) == 0
        inside = self.seen_by(host, self.state)
        inside.mkdir()
        if self.name == "codex":
            (inside / "config.toml").write_text(codex_config(self.stub.port))
        return host

    @staticmethod
    def seen_by(host: SimulatedHost, path: Path) -> Path:
        """`path` as `host` sees it, through its PID 1's root."""
        return Path(f"/proc/{host.reaper_pid}/root") / path.relative_to("/")

    def env(self, path: str = "") -> dict[str, str]:
        bin_dir = os.path.dirname(sys.executable)
        return {"HOME": str(self.home), self.provider.state_env: str(self.state),
                "PATH": path or f"{BIN}:{bin_dir}:/usr/bin:/bin",
                # Claude Code's opt-outs: with them it asks nothing of the network but the model.
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{self.stub.port}", "ANTHROPIC_API_KEY": "stub",
                "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1", "STUB_API_KEY": "stub"}

    def run(self, host: SimulatedHost, session: str, *options: str, prompt: str, path: str = "") -> Run:
        """`holdfast codex|claude --session S OPTIONS -- PROMPT` on `host`, in the working directory."""
        stderr = self.cluster.tmp / f"run-{len(self.cluster.runs)}.err"
        argv = [sys.executable, "-m", "holdfast.cli", self.name, "--session", session, *options, "--", prompt]
        env = {**self.cluster.env(host), **self.env(path)}
        with open(stderr, "wb") as err:
            proc = host.spawn(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                              cwd=str(self.work))
        run = Run(host, proc, stderr)
        self.cluster.runs.append(run)
        return run

    def transcripts(self, host: SimulatedHost) -> list[Path]:
        return sorted(self.seen_by(host, self.state).rglob("*.jsonl"))

    def prompts(self, transcript: Path) -> list[str]:
        """The user prompts the transcript holds, in order."""
        found = []
        for line in transcript.read_text().splitlines():
            event = json.loads(line)
            if self.name == "codex":
                payload = event.get("payload", {})
                if event["type"] == "response_item" and payload.get("role") == "user":
                    # Codex's own context (<environment_context>...) comes as user messages too.
                    found += [part["text"] for part in payload["content"] if not part["text"].startswith("<")]
            elif event.get("type") == "user" and isinstance(event["message"].get("content"), str):
                found.append(event["message"]["content"])
        return found


def codex_config(port: int) -> str:
    """Codex's opt-outs: no plugin sync (GitHub), no update check, no analytics (a 5 s wait at exit,
    offline); the stub as its only model provider."""
    return f"""model = "stub-model"
model_provider = "stub"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
apps = false

[model_providers.stub]
name = "stub"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "STUB_API_KEY"
"""


@pytest.fixture(params=["codex", "claude"])
def agent(request: pytest.FixtureRequest, cluster: Cluster, stub: Stub, tmp_path: Path) -> Agent:
    work = tmp_path / "work dir"
    work.mkdir()
    return Agent(request.param, cluster, stub, work)


def chain(cluster: Cluster, session: str) -> list[str]:
    return [link.handle for link in cluster.record(session).record.provider_handle_chain]


def test_a_thread_started_on_one_host_is_taken_over_mid_turn_by_another(agent: Agent) -> None:
    cluster, stub = agent.cluster, agent.stub
    a, b = agent.host("host-a"), agent.host("host-b")
    sid = f"sess-real-{agent.name}"
    live = agent.run(a, sid, "--grace", "5", prompt="HOLD first prompt")
    until("host 1's turn waiting on the model", stub.held, 60)
    handles = chain(cluster, sid)
    assert len(handles) == 1 and rules.HANDLE.fullmatch(handles[0]), "recorded before the model answered"
    tree = descendants(live.proc.pid)
    refused = agent.run(b, sid, prompt="not while host 1 writes")
    assert refused.wait(60) == 75, refused.err()
    assert "HELD" in refused.err() and "host-a" in refused.err(), refused.err()
    assert agent.transcripts(b) == [], "host 2 never saw the thread"
    taker = agent.run(b, sid, "--takeover", prompt="second prompt")
    assert taker.wait(90) == 0, taker.err()
    assert live.wait(30) != 0 and "handoff requested by host host-b" in live.err(), live.err()
    assert [pid for pid in tree if os.path.exists(f"/proc/{pid}")] == [], "host 1's tree is gone"
    assert cluster.record(sid).record.lease.fence == 2 and chain(cluster, sid) == handles
    [transcript] = agent.transcripts(b)
    assert handles[0] in transcript.name
    assert agent.prompts(transcript) == ["HOLD first prompt", "second prompt"]


def test_of_two_concurrent_resumes_on_two_hosts_exactly_one_runs(agent: Agent) -> None:
    stub = agent.stub
    a, b = agent.host("host-a"), agent.host("host-b")
    sid = f"sess-both-{agent.name}"
    assert agent.run(a, sid, prompt="first prompt").wait(60) == 0
    runs = [agent.run(host, sid, prompt=f"HOLD from {host.host_id}") for host in (a, b)]
    loser = until("one of the two to end", lambda: next((r for r in runs if r.proc.poll() is not None), None),
                  60)
    assert isinstance(loser, Run) and loser.proc.returncode == 75 and "HELD" in loser.err(), loser.err()
    winner = next(r for r in runs if r is not loser)
    until("the winner's turn", stub.held, 60)
    stub.release()
    assert winner.wait(60) == 0, winner.err()
    assert stub.held() == [f"HOLD from {winner.host.host_id}"]
    assert [e["prompt"] for e in stub.entries() if str(e.get("prompt", "")).startswith("HOLD")] == \
        [f"HOLD from {winner.host.host_id}"] * 2, "the loser's CLI never asked the model"


def test_run_s_options_work_with_them(agent: Agent, tmp_path: Path) -> None:
    """--report, --guard, --wait, and --takeover --force, through a provider command."""
    cluster, stub = agent.cluster, agent.stub
    a, b = agent.host("host-a"), agent.host("host-b")
    sid, guard, report = f"sess-options-{agent.name}", tmp_path / "guard", tmp_path / "report.json"
    guard.mkdir()
    first = agent.run(a, sid, "--report", str(report), "--guard", f"dir://{guard}", prompt="HOLD one")
    until("host 1's turn", stub.held, 60)
    waited = agent.run(b, sid, "--wait", "1", prompt="not yet")
    assert waited.wait(60) == 75 and "still held after --wait 1s" in waited.err(), waited.err()
    stub.release()
    assert first.wait(60) == 0
    second = agent.run(b, sid, "--guard", f"dir://{guard}", prompt="two")
    assert second.wait(60) == 0, second.err()
    said = json.loads(report.read_text())
    assert (said["ran"], said["cmd_status"], said["fence"], said["reason"]) == (True, 0, 1, "")
    assert os.readlink(guard / "current") == "gen-2", "the guard's fence reached host 2's grant"
    held = agent.run(a, sid, prompt="HOLD three")
    until("host 1's second turn", lambda: len(stub.held()) == 2, 60)
    taker = agent.run(b, sid, "--takeover", "--force", prompt="four")
    assert taker.wait(60) == 0 and held.wait(30) != 0, taker.err()
    [transcript] = agent.transcripts(b)
    assert agent.prompts(transcript) == ["HOLD one", "two", "HOLD three", "four"]
    assert cluster.record(sid).record.lease.fence == 4


def test_a_handle_that_names_no_thread_passes_the_cli_s_error_through_and_releases(agent: Agent) -> None:
    cluster = agent.cluster
    a = agent.host("host-a")
    sid = f"sess-nothread-{agent.name}"
    ghost = "0199a213-81c0-7800-8aa1-bbab2a035a53"
    bin_dir = os.path.dirname(sys.executable)
    recorded = cluster.run(a, sid, cmd=[f"{bin_dir}/holdfast", "handle", ghost])
    assert recorded.wait(30) == 0, recorded.err()
    failed = agent.run(a, sid, prompt="resume it")
    assert failed.wait(60) == 1, failed.err()
    said = {"codex": f"no rollout found for thread id {ghost}",
            "claude": f"No conversation found with session ID: {ghost}"}
    assert said[agent.name] in failed.err()
    assert cluster.record(sid).record.lease.claim_status == pb.RELEASED


def test_a_missing_cli_is_127_before_anything_is_asked(agent: Agent) -> None:
    cluster = agent.cluster
    a = agent.host("host-a")
    report = cluster.tmp / "report.json"
    run = agent.run(a, "sess-nocli", "--report", str(report), prompt="hi",
                    path=f"{os.path.dirname(sys.executable)}:/usr/bin:/bin")
    assert run.wait(30) == 127 and "command not found" in run.err(), run.err()
    said = json.loads(report.read_text())
    assert (said["ran"], said["exit_code"], said["reason"]) == (False, 127, "CMD_NOT_FOUND")
    sessions = cluster.stub.ListSessions(pb.ListSessionsRequest()).records
    assert "sess-nocli" not in {r.session_id for r in sessions}


def test_state_over_the_cap_is_refused_naming_it_and_nothing_is_uploaded(agent: Agent) -> None:
    cluster = agent.cluster
    a = agent.host("host-a")
    carried = agent.seen_by(a, Path(rules.carried_path(agent.provider, str(agent.state), str(agent.work))))
    carried.mkdir(parents=True, exist_ok=True)
    (carried / "big.jsonl").write_bytes(b"x" * (5 << 20))
    run = agent.run(a, "sess-overcap", prompt="hi")
    assert run.wait(30) == 2, run.err()
    assert "CARRY_TOO_LARGE" in run.err() and "cap of 4194304 bytes" in run.err(), run.err()
    assert not cluster.stub.GetCarry(pb.GetCarryRequest(session_id="sess-overcap")).found


def test_a_claude_resume_from_another_directory_is_refused_naming_the_recorded_one(
        cluster: Cluster, stub: Stub, tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    a = Agent("claude", cluster, stub, here).host("host-a")
    sid = "sess-claude-cwd"
    assert Agent("claude", cluster, stub, here).run(a, sid, prompt="first prompt").wait(60) == 0
    elsewhere = Agent("claude", cluster, stub, there).run(a, sid, prompt="from elsewhere")
    assert elsewhere.wait(30) == 2, elsewhere.err()
    assert f"kept for the working directory {here}" in elsewhere.err(), elsewhere.err()
    assert cluster.record(sid).record.lease.fence == 1, "nothing was asked of the session"
