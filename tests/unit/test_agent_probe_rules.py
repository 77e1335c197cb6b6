"""The probe verdict, exhaustively, as a pure function (docs/design.md §2 order and the seeds' rules)."""

from __future__ import annotations

import pytest

from holdfast.agent import probe_rules
from holdfast.agent.probe_rules import PROVEN_DEAD, Observation, TreeObservation, tree_verdict
from holdfast.common.incarnation_rules import incarnation_verdict, machine_id_problem
from holdfast.v1 import agent_pb2

P = agent_pb2.ProbeOutcome
MACHINE = "3d1219c7c4c5404aaa1f6d2a48adfda4"  # one that names a machine: an invalid one proves no end
INC = agent_pb2.HostIncarnation(machine_id=MACHINE, boot_id="b", pid_ns=4026531836, ns_init_start_ticks=10)
CG = agent_pb2.CgroupRef(path="/sys/fs/cgroup/s", inode=5)
TOKEN = "0123456789abcdef0123456789abcdef"
VAR = "HOLDFAST_SPAWN_TOKEN"


def judge(identity: agent_pb2.ProcessIdentity, host_id: str, incarnation: agent_pb2.HostIncarnation,
          seen: Observation) -> agent_pb2.ProbeResult:
    """The rule as an agent configured with VAR applies it."""
    return probe_rules.judge(identity, host_id, incarnation, seen, VAR)


def ident(**kw: object) -> agent_pb2.ProcessIdentity:
    base = {"host_id": "h", "incarnation": INC, "pid": 42, "start_ticks": 1000, "pidfd_ino": 77,
            "spawn_token": TOKEN, "spawn_token_env": VAR}
    return agent_pb2.ProcessIdentity(**{**base, **kw})  # type: ignore[arg-type]


def live(**kw: object) -> Observation:
    return Observation(**{"state": "S", "start_ticks": 1000, "pidfd_ino": 77, "token_matched": True, **kw})


def inc(**kw: object) -> agent_pb2.HostIncarnation:
    i = agent_pb2.HostIncarnation()
    i.CopyFrom(INC)
    for k, v in kw.items():
        setattr(i, k, v)
    return i


def test_all_matching_is_alive_on_every_element() -> None:
    r = judge(ident(), "h", INC, live())
    assert r.outcome == P.IDENTITY_MATCHED and list(r.matched_on) == ["pidfd", "start-time", "token"]


def test_other_host_is_misrouted_even_when_everything_else_differs() -> None:
    r = judge(ident(host_id="other"), "h", inc(boot_id="new"), Observation(absent=True))
    assert r.outcome == P.INDETERMINATE and "misrouted" in r.reason


@pytest.mark.parametrize(
    ("current", "outcome"),
    [
        (inc(boot_id="rebooted"), P.IDENTITY_MISMATCH),  # same machine, new boot
        (inc(ns_init_start_ticks=99), P.IDENTITY_MISMATCH),  # same ns inode reused by a new namespace
        (inc(pid_ns=4026532000), P.INDETERMINATE),  # another namespace: the old may still exist
        (inc(machine_id="f" * 32, boot_id="x"), P.INDETERMINATE),  # another machine, same name
    ],
)
def test_incarnation_rule(current: agent_pb2.HostIncarnation, outcome: int) -> None:
    r = judge(ident(), "h", current, live())
    assert r.outcome == outcome
    if outcome == P.IDENTITY_MISMATCH:
        assert r.mismatch_field == "incarnation"


@pytest.mark.parametrize("machine_id", ["", "uninitialized", "0" * 32, "m", "3d1219c7-c4c5-404a-aa1f-6d2a4"])
def test_a_machine_id_naming_no_one_machine_proves_no_end(machine_id: str) -> None:
    """Two machines without a machine id (or with the same placeholder) under one host id: their
    boot ids differ, their namespaces' inits started at different ticks, and neither proves the
    other's owners dead. Only the very same incarnation is still 'same'."""
    recorded = inc(machine_id=machine_id)
    assert machine_id_problem(machine_id)
    rebooted = inc(machine_id=machine_id, boot_id="x")
    reused = inc(machine_id=machine_id, ns_init_start_ticks=99)
    for current in (rebooted, reused, inc(boot_id="x")):
        verdict, why = incarnation_verdict(recorded, current)
        assert verdict == "unknown" and "names no one machine" in why
        r = judge(ident(incarnation=recorded), "h", current, live())
        assert r.outcome == P.INDETERMINATE and not r.mismatch_field
    assert incarnation_verdict(recorded, inc(machine_id=machine_id)) == ("same", "")
    assert machine_id_problem(MACHINE) == machine_id_problem(MACHINE.upper()) == ""


def test_order_watched_exit_before_absent_before_error() -> None:
    assert judge(ident(), "h", INC, Observation(exit_watched=True, absent=True)).outcome == P.EXIT_OBSERVED
    assert judge(ident(), "h", INC, Observation(absent=True, error="x")).outcome == P.PID_ABSENT


def test_eperm_eio_parse_failure_fail_closed() -> None:
    r = judge(ident(), "h", INC, Observation(error="pidfd_open(42): Operation not permitted"))
    assert r.outcome == P.INDETERMINATE and "not permitted" in r.reason


def test_pidfs_inode_differs_is_mismatch_even_with_same_ticks() -> None:
    r = judge(ident(), "h", INC, live(pidfd_ino=78, token_matched=False))
    assert (r.outcome, r.mismatch_field) == (P.IDENTITY_MISMATCH, "pidfd")


def test_pidfs_inode_matches_but_ticks_differ_is_contradiction() -> None:
    r = judge(ident(), "h", INC, live(start_ticks=1001))
    assert r.outcome == P.INDETERMINATE and r.contradiction


def test_start_ticks_differ_is_mismatch_without_token_match() -> None:
    r = judge(ident(pidfd_ino=0), "h", INC, live(start_ticks=1001, token_matched=False))
    assert (r.outcome, r.mismatch_field) == (P.IDENTITY_MISMATCH, "start-time")
    r = judge(ident(pidfd_ino=0), "h", INC, live(start_ticks=1001, token_matched=None))
    assert r.mismatch_field == "start-time"


def test_token_match_with_contradicting_start_time_is_indeterminate() -> None:
    r = judge(ident(pidfd_ino=0), "h", INC, live(start_ticks=1001, token_matched=True))
    assert r.outcome == P.INDETERMINATE and r.contradiction


def test_missing_token_is_never_death() -> None:
    # Rewritten environ / exec with a new one: pidfd and ticks still prove it is the owner.
    r = judge(ident(), "h", INC, live(token_matched=False))
    assert r.outcome == P.IDENTITY_MATCHED and "token" not in r.matched_on
    # Without a pidfs inode, ticks alone cannot exclude same-tick reuse: not alive, not dead.
    r = judge(ident(pidfd_ino=0), "h", INC, live(token_matched=False))
    assert r.outcome == P.INDETERMINATE and r.outcome not in PROVEN_DEAD


def test_bare_pid_match_proves_nothing() -> None:
    r = judge(ident(pidfd_ino=0, start_ticks=0, spawn_token=""), "h", INC, live(token_matched=None))
    assert r.outcome == P.INDETERMINATE and "only the pid" in r.reason


def test_zombie_counts_as_exited_only_when_its_pidfd_is_readable() -> None:
    assert judge(ident(), "h", INC, live(state="Z", pidfd_exited=True)).outcome == P.EXIT_OBSERVED
    # A leader that called pthread_exit: Z while other threads run, pidfd not readable.
    assert judge(ident(), "h", INC, live(state="Z", pidfd_exited=False)).outcome == P.IDENTITY_MATCHED


def test_zombie_without_pidfs_is_exit_observed_on_start_ticks() -> None:
    # No environ to read (token None), ticks match, pidfd polls readable: gone either way,
    # since a same-tick reuse would also mean the owner is gone.
    seen = live(state="Z", pidfd_exited=True, pidfd_ino=0, token_matched=None)
    assert judge(ident(pidfd_ino=0), "h", INC, seen).outcome == P.EXIT_OBSERVED


def tree(**kw: object) -> TreeObservation:
    return TreeObservation(**{"enumerable": True, "complete": True, "unreadable": 0, "carriers": 0,
                              "cgroup_populated": None, **kw})


GONE, ALIVE, UNPROVEN = agent_pb2.TREE_GONE, agent_pb2.TREE_ALIVE, agent_pb2.TREE_UNPROVEN


@pytest.mark.parametrize(
    ("identity", "seen", "state", "why"),
    [
        (ident(), tree(), GONE, "no process"),
        (ident(), tree(carriers=1), ALIVE, "still carry"),
        (ident(), tree(complete=False, unreadable=3), UNPROVEN, "3 process(es) could not be read"),
        (ident(), tree(enumerable=False, complete=False), UNPROVEN, "cannot enumerate"),
        (ident(spawn_token=""), tree(), UNPROVEN, "no spawn token"),
        (ident(cgroup=CG), tree(cgroup_populated=True), ALIVE, "populated"),
        (ident(cgroup=CG), tree(), UNPROVEN, "could not be read"),
        (ident(cgroup=CG), tree(cgroup_populated=False), GONE, "cgroup is empty"),
        # A scan that never settled (a fork-hopping tree, or a busy host's processes exiting as it
        # reads them) proves nothing, whatever it counted: neither gone nor alive.
        (ident(), tree(complete=False, stable=False, passes=8), UNPROVEN, "did not settle in 8 passes"),
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_AND_SCAN), tree(cgroup_populated=False, carriers=1),
         ALIVE, "still carry"),
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_AND_SCAN),
         tree(cgroup_populated=False, complete=False, stable=False), UNPROVEN, "did not settle"),
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_AND_SCAN),
         tree(cgroup_populated=False, complete=False, unreadable=1), UNPROVEN, "1 process(es) could not"),
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_AND_SCAN), tree(cgroup_populated=True),
         ALIVE, "populated"),
        # A tree that cannot leave its cgroup: the empty cgroup alone proves it, even unsettled.
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_ONLY),
         tree(cgroup_populated=False, complete=False, stable=False), GONE, "could not leave"),
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_ONLY), tree(cgroup_populated=True), ALIVE, "populated"),
        # ... but a carrier seen outside it is alive all the same (a second root beside the gate).
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_ONLY), tree(cgroup_populated=False, carriers=1),
         ALIVE, "still carry"),
        (ident(cgroup=CG, tree_proof=agent_pb2.CGROUP_ONLY), tree(), UNPROVEN, "could not be read"),
        (ident(tree_proof=agent_pb2.SCAN_ONLY), tree(), GONE, "no process"),
        (ident(tree_proof=agent_pb2.SCAN_ONLY), tree(complete=False, stable=False), UNPROVEN,
         "did not settle"),
        # A member seen decides before an unsettled or incomplete scan: alive, not merely unproven.
        (ident(), tree(carriers=2, complete=False, stable=False), ALIVE, "2 process(es) still carry"),
        (ident(cgroup=CG), tree(cgroup_populated=True, complete=False, unreadable=4), ALIVE, "populated"),
    ],
)
def test_the_tree_is_gone_on_proof_alive_on_a_member_seen_and_unproven_otherwise(
        identity, seen, state, why) -> None:
    verdict, reason = tree_verdict(identity, seen, VAR)
    assert verdict == state and why in reason


@pytest.mark.parametrize("recorded", ["ORCA_AGENT_SESSION_SPAWN_TOKEN", ""])
def test_an_owner_attested_under_another_variable_is_indeterminate_whatever_was_seen(recorded: str) -> None:
    # An agent restarted with another --spawn-token-env scans for the wrong name: its "no carrier"
    # and even its pid evidence are about a token it cannot read, so nothing is proven.
    for seen in (Observation(absent=True), live(), Observation(exit_watched=True)):
        r = judge(ident(spawn_token_env=recorded), "h", INC, seen)
        assert r.outcome == P.INDETERMINATE and VAR in r.reason
    assert tree_verdict(ident(spawn_token_env=recorded), tree(), VAR) == (
        agent_pb2.TREE_UNPROVEN,
        f"the scan reads {VAR}, not {recorded or 'the unnamed'} variable the token was attested in")


def test_an_owner_without_a_token_needs_no_variable() -> None:
    assert judge(ident(spawn_token="", spawn_token_env=""), "h", INC, Observation(absent=True)).outcome == \
        P.PID_ABSENT


@pytest.mark.parametrize("recorded", [0, 77])
@pytest.mark.parametrize("seen_ino", [0, 77, 78])
@pytest.mark.parametrize("seen", [live(), live(start_ticks=999), live(state="Z", pidfd_exited=True),
                                  live(state="Z"), live(start_ticks=999, token_matched=False)])
def test_the_token_is_read_only_where_it_can_change_the_outcome(recorded: int, seen_ino: int,
                                                                 seen: Observation) -> None:
    identity = ident(pidfd_ino=recorded)
    outcomes = {judge(identity, "h", INC, Observation(**{**seen.__dict__, "pidfd_ino": seen_ino,
                                                         "token_matched": token})).outcome
                for token in (True, False, None)}
    if not probe_rules.token_decides(identity, seen_ino):
        assert len(outcomes) == 1
    assert probe_rules.token_decides(identity, seen_ino) == (not (recorded and seen_ino))
    assert not probe_rules.token_decides(ident(spawn_token=""), 0)


def test_a_pid_missing_from_proc_is_absent_only_when_its_pidfd_reports_the_exit() -> None:
    """/proc mounted hidepid=invisible shows a live process the agent may not ptrace-read as
    ENOENT, as if it had ended: only its pidfd (opened before the read) tells them apart."""
    hidden = probe_rules.missing_from_proc(42, exit_watched=False, pidfd_exited=False)
    assert not hidden.absent and "hides a live pid" in hidden.error
    r = judge(ident(), "h", INC, hidden)
    assert r.outcome == P.INDETERMINATE and "hides a live pid" in r.reason
    ended = probe_rules.missing_from_proc(42, exit_watched=False, pidfd_exited=True)
    assert ended.absent and judge(ident(), "h", INC, ended).outcome == P.PID_ABSENT


def test_a_scan_of_a_listing_that_hides_processes_proves_no_tree_gone() -> None:
    why = "/proc is mounted hidepid=invisible"
    state, reason = tree_verdict(ident(), tree(enumerable=False, complete=False, hidden=why), VAR)
    assert state == UNPROVEN and why in reason
