"""Running a fence agent: real programs (small shell scripts) on stdin, in their own process group,
killed whole at the timeout; secrets read from files and masked in what is recorded."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import textwrap
from pathlib import Path

import pytest

from holdfast.coordinator import fence_rules, fencers
from holdfast.coordinator.fence_rules import Answer, FencerSpec


def script(tmp: Path, body: str, name: str = "fence_test") -> str:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


# Saves its stdin per action, then answers like a real agent whose device is now off.
GOOD = """
    input=$(cat)
    action=$(printf '%s\\n' "$input" | sed -n 's/^action=//p')
    printf '%s\\n' "$input" > "$(dirname "$0")/stdin-$action"
    case "$action" in
      off) echo "Success: Powered OFF"; exit 0;;
      status) echo "Status: OFF"; exit 2;;
    esac
    exit 1
"""


def test_off_then_status_is_proof_and_secrets_never_leave_their_file(tmp_path: Path) -> None:
    secret = tmp_path / "pass"
    secret.write_text("hunter2\n")
    program = script(tmp_path, GOOD + "")
    spec = FencerSpec("h*", program, (("plug", "{host}"),), (("password", str(secret)),))
    actions, answer, why = asyncio.run(fencers.fence(spec, "h1", 5.0))
    assert answer is Answer.OFF, why
    assert [(a.action, a.exit_code) for a in actions] == [("off", 0), ("status", 2)]
    assert (tmp_path / "stdin-off").read_text() == "action=off\nplug=h1\npassword=hunter2\n"
    assert (tmp_path / "stdin-status").read_text().startswith("action=status\n")


def test_recorded_output_masks_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "pass"
    secret.write_text("hunter2")
    program = script(tmp_path, """
        cat >/dev/null
        echo "login with hunter2 failed" >&2
        echo "Failed: hunter2"
        exit 3
    """)
    spec = FencerSpec("h1", program, (), (("password", str(secret)),))
    actions, answer, _ = asyncio.run(fencers.fence(spec, "h1", 5.0))
    assert answer is Answer.UNKNOWN and len(actions) == 1  # no status after a failed off
    assert "hunter2" not in actions[0].stdout + actions[0].stderr
    assert actions[0].exit_code == 3 and "*****" in actions[0].stderr


def running(pid: int) -> bool:
    """Whether `pid` still runs once a SIGKILL sent to it has had its effect: the kernel ends a
    killed process when it next schedules it, not within the kill call, so its exit is waited for
    on a pidfd (the event), for at most 10 s."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not select.select([fd], [], [], 10.0)[0]:
            return True
    finally:
        os.close(fd)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_a_hung_agent_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    program = script(tmp_path, f"""
        cat >/dev/null
        sleep 300 &
        echo $! > {pids}
        echo $$ >> {pids}
        wait
    """)
    actions, answer, why = asyncio.run(fencers.fence(FencerSpec("h1", program), "h1", 0.5))
    assert answer is Answer.UNKNOWN and actions[0].timed_out, why
    # The agent and its helper both ended (a zombie awaiting its reaper runs nothing).
    assert [pid for pid in map(int, pids.read_text().split()) if running(pid)] == []


def test_a_missing_program_or_secret_is_unknown_not_an_error(tmp_path: Path) -> None:
    actions, answer, why = asyncio.run(fencers.fence(FencerSpec("h1", str(tmp_path / "nope")), "h1", 1.0))
    assert answer is Answer.UNKNOWN and not actions[0].ran and "could not be run" in why
    spec = FencerSpec("h1", script(tmp_path, GOOD), (), (("password", str(tmp_path / "gone")),))
    actions, answer, why = asyncio.run(fencers.fence(spec, "h1", 1.0))
    assert answer is Answer.UNKNOWN and "secret unreadable" in actions[0].error, why


def test_status_on_after_off_answers_on(tmp_path: Path) -> None:
    program = script(tmp_path, """
        action=$(sed -n 's/^action=//p')
        [ "$action" = off ] && { echo "Success: Powered OFF"; exit 0; }
        echo "Status: ON"; exit 0
    """)
    _, answer, _ = asyncio.run(fencers.fence(FencerSpec("h1", program), "h1", 5.0))
    assert answer is Answer.ON


def test_start_checks_programs_and_secret_files(tmp_path: Path) -> None:
    program = script(tmp_path, GOOD)
    fencers.check_fencers([FencerSpec("h1", program)])
    with pytest.raises(ValueError, match="not an executable file"):
        fencers.check_fencers([FencerSpec("h1", str(tmp_path / "missing"))])
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(ValueError, match="not an executable file"):
        fencers.check_fencers([FencerSpec("h1", str(plain))])
    with pytest.raises(ValueError, match=r"secret file .* is not a readable file"):
        fencers.check_fencers([FencerSpec("h1", program, (), (("password", str(tmp_path / "none")),))])


def test_start_refuses_an_agent_that_proves_nothing_under_another_name(tmp_path: Path) -> None:
    # The name check at parse time sees only the configured path: a link named like a power agent
    # that resolves to fence_dummy (or a copy's link chain) is caught on the file it resolves to.
    dummy = Path(script(tmp_path, GOOD, "fence_dummy"))
    link = tmp_path / "fence_power"
    link.symlink_to(dummy)
    chain = tmp_path / "fence_ipmilan"
    chain.symlink_to(link)
    for program in (link, chain):
        spec, = fence_rules.parse_fencers([{"hosts": "h1", "program": str(program)}])
        with pytest.raises(ValueError, match=f"{program} .* resolves to .*fence_dummy, which proves nothing"):
            fencers.check_fencers([spec])


def within(seconds: float, spec: FencerSpec, timeout: float) -> tuple[list[object], Answer, str]:
    """fence() bounded from outside: a run that outlives its own timeout fails the test, not hangs it."""
    async def bounded() -> tuple[list[object], Answer, str]:
        actions, answer, why = await asyncio.wait_for(fencers.fence(spec, "h1", timeout), seconds)
        return list(actions), answer, why
    return asyncio.run(bounded())


def test_an_agent_printing_without_end_is_killed_at_its_timeout(tmp_path: Path) -> None:
    # Read without bound and then left unread, its output stalled the pipe: the agent was killed but
    # its end never seen, so the fence (and the replica's whole fencing loop) waited forever.
    program = script(tmp_path, """
        cat >/dev/null
        exec yes "Success: Powered OFF"
    """)
    _, answer, why = within(20, FencerSpec("h1", program), 1.0)
    assert answer is Answer.UNKNOWN and "did not finish" in why


def test_a_helper_that_left_the_group_holding_stdout_does_not_outlast_the_timeout(tmp_path: Path) -> None:
    # Killing the group leaves a helper in a session of its own (setsid) holding the agent's stdout:
    # waiting for that pipe's end waited for the helper.
    escaped = tmp_path / "escaped"
    program = script(tmp_path, f"""
        cat >/dev/null
        setsid sleep 60 &
        echo $! > {escaped}
        sleep 60
    """)
    try:
        _, answer, why = within(20, FencerSpec("h1", program), 1.0)
        assert answer is Answer.UNKNOWN and "did not finish" in why
    finally:
        if escaped.exists():
            os.kill(int(escaped.read_text()), signal.SIGKILL)


CHATTY = """
    action=$(sed -n 's/^action=//p')
    i=0; while [ $i -lt 100 ]; do echo "progress line $i: waiting for the chassis to answer"; i=$((i+1)); done
    [ "$action" = off ] && { echo "Success: Powered OFF"; exit 0; }
    echo "Status: OFF"
    %s
    exit 2
"""


def test_the_proof_is_judged_on_all_the_agent_printed_not_on_the_recorded_excerpt(tmp_path: Path) -> None:
    # Judged on the recorded excerpt (its first 2048 characters), a chatty agent's proof was lost,
    # and a 'Status: ON' printed after the excerpt was never seen.
    program = script(tmp_path, CHATTY % "")
    actions, answer, why = asyncio.run(fencers.fence(FencerSpec("h1", program), "h1", 5.0))
    assert answer is Answer.OFF, why
    assert len(actions[0].stdout) <= fence_rules.OUTPUT_KEPT
    contradicted = script(tmp_path, CHATTY % 'echo "Status: ON"', "fence_contradicted")
    _, answer, why = asyncio.run(fencers.fence(FencerSpec("h1", contradicted), "h1", 5.0))
    assert answer is Answer.UNKNOWN, why


def test_a_secret_masked_in_the_record_hides_nothing_from_the_judge(tmp_path: Path) -> None:
    # Judged after masking, a password 'ON' turned 'Status: ON' into 'Status: *****'.
    secret = tmp_path / "pass"
    secret.write_text("ON\n")
    program = script(tmp_path, """
        action=$(sed -n 's/^action=//p')
        [ "$action" = off ] && { echo "Success: Powered OFF"; exit 0; }
        echo "Status: OFF"; echo "Status: ON"; exit 2
    """)
    spec = FencerSpec("h1", program, (), (("password", str(secret)),))
    actions, answer, why = asyncio.run(fencers.fence(spec, "h1", 5.0))
    assert answer is Answer.UNKNOWN, why
    assert "Status: ON" not in actions[1].stdout  # the record still masks it


def test_an_agent_printing_more_than_is_read_proves_nothing(tmp_path: Path) -> None:
    program = script(tmp_path, f"""
        action=$(sed -n 's/^action=//p')
        yes x | head -c {fencers.OUTPUT_READ + 1}
        [ "$action" = off ] && {{ echo "Success: Powered OFF"; exit 0; }}
        echo "Status: OFF"; exit 2
    """)
    actions, answer, why = asyncio.run(fencers.fence(FencerSpec("h1", program), "h1", 5.0))
    assert answer is Answer.UNKNOWN and "more than" in why, why
    assert len(actions) == 1
