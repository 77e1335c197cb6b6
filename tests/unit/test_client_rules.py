"""Pure client rules: exit codes and next steps, the child's environment, grant files, statuses."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from holdfast.client.acquire import RunSpec, held_hint, resolve_command
from holdfast.client.errors import ClientError
from holdfast.client.gate import gate_argv
from holdfast.client.grant import GRANT_FILE, Grant
from holdfast.client.owner import cli_on_path, grant_environment, resume_of, spawn_environment, status_of
from holdfast.common import reasons
from holdfast.v1 import coordinator_pb2 as pb


@pytest.mark.parametrize("reason,code", [
    ("HELD", 75), ("RESERVED", 75), ("OWNERSHIP_UNKNOWN", 75), ("MANUAL_RECOVERY", 75),
    ("OPERATION_CONFLICT", 75), ("STALE_FENCE", 75), ("ATTESTATION_FAILED", 75),
    ("UNAVAILABLE", 69), (reasons.Reason.UNREACHABLE, 69), ("HOST_NOT_REGISTERED", 69),
    ("PERMISSION_DENIED", 77), ("UNAUTHENTICATED", 77), ("INVALID_ARGUMENT", 2),
])
def test_exit_codes_of_design_section_6(reason: str, code: int) -> None:
    assert reasons.exit_code(reason) == code


def test_every_coordinator_reason_has_a_next_step_naming_the_session() -> None:
    for reason in [r for r, m in reasons.TABLE.items() if m.exit]:
        step = reasons.next_step(reason, "my-session-01")
        assert step and "{session}" not in step
    assert "my-session-01" in reasons.next_step("OWNERSHIP_UNKNOWN", "my-session-01")


def test_unknown_reason_is_a_plain_failure_with_a_pointer() -> None:
    assert reasons.exit_code("SOMETHING_NEW") == 1
    assert reasons.next_step("SOMETHING_NEW")


def grant() -> Grant:
    return Grant("my-session-01", 7, "s" * 64, "a" * 32, "HOLDFAST_SPAWN_TOKEN", "127.0.0.1:7420")


def child_environment(grant: Grant, grant_file: str, base: dict[str, str],
                      record: pb.SessionRecord | None = None) -> dict[str, str]:
    """CMD's whole environment once granted: what `run` sets before the grant, then the grant's."""
    return {**spawn_environment(grant.session_id, grant.coordinator, grant.spawn_token_env, grant.spawn_token,
                                base),
            **grant_environment(grant, record, grant_file)}


def test_child_environment_of_design_section_5() -> None:
    # An enclosing run's handle never leaks in: a session with no handle yet says so, empty.
    outer = {"PATH": "/bin", "HOLDFAST_FENCE": "1", "HOLDFAST_PROVIDER_HANDLE": "outer-thread"}
    env = child_environment(grant(), "/tmp/x/grant.json", outer)
    assert env == {"PATH": cli_on_path("/bin"), "HOLDFAST_SPAWN_TOKEN": "a" * 32,
                   "HOLDFAST_SESSION": "my-session-01", "HOLDFAST_FENCE": "7",
                   "HOLDFAST_COORDINATOR": "127.0.0.1:7420", "HOLDFAST_GRANT_FILE": "/tmp/x/grant.json",
                   "HOLDFAST_PROVIDER": "", "HOLDFAST_PROVIDER_HANDLE": "", "HOLDFAST_GUARDS": ""}
    assert "s" * 64 not in env.values()  # the secret travels only in the 0600 file


def written(directory: Path, resume: dict[str, object] | None = None) -> Path:
    """grant() written in `directory`, as Grant.write makes it: through a descriptor held on it."""
    held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        grant().write(held, resume)
    finally:
        os.close(held)
    return directory / GRANT_FILE


def test_the_child_is_handed_the_newest_provider_handle_and_the_file_the_chain(tmp_path: Path) -> None:
    record = pb.SessionRecord(session_id="my-session-01", provider="codex", provider_handle_chain=[
        pb.ProviderHandleLink(handle="thread-1", minted_at_fence=1),
        pb.ProviderHandleLink(handle="thread-2", minted_at_fence=3)])
    env = child_environment(grant(), "/tmp/x/grant.json", {"PATH": "/bin"}, record=record)
    assert (env["HOLDFAST_PROVIDER"], env["HOLDFAST_PROVIDER_HANDLE"]) == ("codex", "thread-2")
    path = written(tmp_path, resume_of(record))
    assert json.loads(Path(path).read_text())["resume"] == {
        "provider": "codex", "provider_handle_chain": [{"handle": "thread-1", "minted_at_fence": 1},
                                                       {"handle": "thread-2", "minted_at_fence": 3}]}
    assert Grant.from_file(path) == grant()  # what rides along is not part of the grant


def test_the_cli_is_appended_to_a_path_that_lacks_it(tmp_path: Path) -> None:
    here = os.path.dirname(sys.executable)  # the test venv's bin, which has `holdfast`
    assert cli_on_path("/bin") == f"/bin{os.pathsep}{here}"  # after the child's own tools
    assert cli_on_path(f"/bin{os.pathsep}{here}") == f"/bin{os.pathsep}{here}"  # found: unchanged


def test_grant_file_is_0600_round_trips_and_hides_the_secret_in_repr(tmp_path: Path) -> None:
    path = written(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Grant.from_file(path) == grant()
    assert "s" * 64 not in repr(grant()) and "a" * 32 not in repr(grant())


def test_status_of_follows_the_shell() -> None:
    assert status_of(0) == 0 and status_of(3) == 3
    assert status_of(-15) == 143 and status_of(-9) == 137


def test_gate_program_execs_only_on_the_exact_word() -> None:
    argv = gate_argv(12, ["codex", "resume", "a b"])
    assert argv[:2] == ["/bin/sh", "-c"]
    assert '[ "$go" = committed ] && exec "$@"' in argv[2] and "/dev/fd/12" in argv[2]
    assert argv[4:] == ["codex", "resume", "a b"]  # passed as arguments, never through the shell's parser


def test_a_uid_without_a_passwd_entry_still_builds_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    # The image runs as uid 65532, which has no passwd entry: getpass.getuser() raises KeyError.
    import getpass

    from holdfast.cli import main as cli
    from holdfast.cli import run_commands

    def no_entry() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_entry)
    assert run_commands.default_operator().startswith(f"uid-{os.getuid()}@")
    args = cli.build_parser().parse_args(["drain", "node-a"])
    assert args.operator.startswith("uid-")


def test_cmd_is_resolved_as_the_shell_would(tmp_path: Path) -> None:
    """Issue 17: CMD is looked up before anything is asked, with the shell's 127 and 126."""
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    plain = tmp_path / "plain"
    plain.write_text("data\n")
    plain.chmod(0o644)
    assert resolve_command(["tool", "-x"], path=str(tmp_path)) == str(tool)
    assert resolve_command(["./tool"], cwd=str(tmp_path), path="") == os.path.join(tmp_path, "./tool")
    Reason = reasons.Reason
    cases = [(["nosuchcmd"], Reason.CMD_NOT_FOUND, 127), (["./nosuch"], Reason.CMD_NOT_FOUND, 127),
             (["plain"], reasons.Reason.CMD_NOT_EXECUTABLE, 126),
             ([str(plain)], reasons.Reason.CMD_NOT_EXECUTABLE, 126),
             ([str(tmp_path)], reasons.Reason.CMD_NOT_EXECUTABLE, 126)]
    for argv, reason, code in cases:
        with pytest.raises(ClientError) as refused:
            resolve_command(argv, cwd=str(tmp_path), path=str(tmp_path))
        assert (refused.value.reason, refused.value.exit_code) == (reason, code), argv
        assert "nothing was asked of the session's owner" in str(refused.value)


def test_the_operations_refusal_table_names_every_reason() -> None:
    """docs/operations.md's refusal table is where a user looks a reason up (issue 17: it lacked
    HOST_NOT_REGISTERED); every FAILED_PRECONDITION or ABORTED reason the coordinator sends is in it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = text.split("## Refusal reasons", 1)[1]
    rows = {line.split("|")[1].strip().strip("`").split("`")[0]: line.split("|")[2].strip()
            for line in table.splitlines() if line.startswith("| `")}
    wanted = {reason: m.code.name for reason, m in reasons.TABLE.items()
              if m.code is not None and m.code.name in ("FAILED_PRECONDITION", "ABORTED")}
    assert set(wanted) - set(rows) == set()
    # The status column says what the one table of reasons declares.
    assert {reason: rows[reason] for reason in wanted} == wanted


def test_next_steps_fit_what_was_tried_and_what_is_known() -> None:
    """Issue 17: `--fence N` printed where the fence is known; --takeover suggested after a failed
    --takeover; --wait suggested after --wait ran out."""
    assert "--fence 7 --reason" in reasons.next_step("OWNERSHIP_UNKNOWN", "s-1", fence=7)
    assert "--fence N --reason" in reasons.next_step("MANUAL_RECOVERY", "s-1")
    takeover = held_hint(RunSpec("s-1", ["true"], takeover=True, handoff_timeout=5))
    assert "add `--force`" in takeover and "5s" in takeover
    waited = held_hint(RunSpec("s-1", ["true"], wait=2))
    assert "still held after --wait 2s" in waited and "--takeover" in waited
    assert held_hint(RunSpec("s-1", ["true"])) == ""  # the table's own: --wait, --takeover, --force
    err = ClientError("HELD", "held by host-a")
    err.hint = waited
    assert str(err).endswith(f"Next: {waited}")


def test_a_grant_file_not_this_users_alone_is_never_read(tmp_path: Path) -> None:
    """Where another user may rename in TMPDIR, they can put their own directory where the grant
    directory was: CMD, reading the grant file by its path, would send its writes to the
    coordinator theirs names."""
    grant = Grant("sess-unit-theirs", 1, "secret", "token", "HOLDFAST_SPAWN_TOKEN", "127.0.0.1:1")
    path = tmp_path / GRANT_FILE
    path.write_text(json.dumps(dataclasses.asdict(grant)))
    path.chmod(0o644)
    with pytest.raises(ValueError, match="not a grant file of this user's alone"):
        Grant.from_file(path)
    path.chmod(0o600)
    assert Grant.from_file(path) == grant
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        with pytest.raises(ValueError, match="owner uid 65534"):
            Grant.from_file(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ValueError, match="not a grant file"):  # refused without waiting for a writer
        Grant.from_file(fifo)
