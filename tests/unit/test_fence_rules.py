"""The pure rules of fencing a lost host, exhaustively: settings, the stdin text, the proof, masking,
which hosts qualify and when, what the proof frees."""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import pytest

from holdfast.coordinator import fence_rules
from holdfast.coordinator.fence_rules import Answer, FencerSpec, Gates
from holdfast.v1 import agent_pb2 as apb
from holdfast.v1 import coordinator_pb2 as pb

IPMI = {"hosts": "node-*", "program": "/usr/sbin/fence_ipmilan",
        "options": {"ip": "127.0.0.5", "username": "admin", "lanplus": True, "plug": "{host}", "ipport": 623},
        "secrets": {"password": "/etc/holdfast/ipmi-pass"}}


def test_fencers_parse_from_toml_tables_and_from_json_text() -> None:
    spec, = fence_rules.parse_fencers([IPMI])
    assert spec == FencerSpec("node-*", "/usr/sbin/fence_ipmilan",
                              (("ip", "127.0.0.5"), ("ipport", "623"), ("lanplus", "1"), ("plug", "{host}"),
                               ("username", "admin")),
                              (("password", "/etc/holdfast/ipmi-pass"),))
    import json
    assert fence_rules.parse_fencers(json.dumps([IPMI])) == (spec,)
    assert fence_rules.parse_fencers("") == ()
    assert fence_rules.parse_fencers([]) == ()


@pytest.mark.parametrize(("raw", "says"), [
    ("{not json", "not a JSON list"),
    ({"hosts": "a"}, "must be a list"),
    (["x"], "fencer 1 must be a table"),
    ([{**IPMI, "colour": "red"}], "unknown key 'colour'"),
    ([{**IPMI, "hosts": ""}], "hosts must name"),
    ([{**IPMI, "hosts": 3}], "hosts must name"),
    ([{**IPMI, "program": "fence_ipmilan"}], "absolute path"),
    ([{**IPMI, "program": "/usr/sbin/fence_dummy"}], "proves nothing"),
    ([{**IPMI, "program": "/usr/sbin/fence_ack_manual"}], "proves nothing"),
    ([{**IPMI, "program": "/usr/sbin/fence_zvmip"}], "missing_as_off is on by default"),
    ([{**IPMI, "options": {"plug": "{host}", "missing_as_off": True}}], "option missing_as_off"),
    ([{**IPMI, "options": {"plug": "{host}", "missing-as-off": "on"}}], "option missing_as_off"),
    ([{**IPMI, "options": {"plug": "{host}", "missing_as_off": '"YES"'}}], "option missing_as_off"),
    ([{**IPMI, "options": {"plug": "{host}", "missing_as_off": "2"}}], "option missing_as_off"),
    ([{**IPMI, "secrets": {"missing_as_off": "/etc/x"}}], "option missing_as_off"),
    # fence-agents keeps a false flag as "0" and its agents test only that the key is there.
    *[([{**IPMI, "options": {"plug": "{host}", "missing_as_off": false}}], "false included")
      for false in (False, 0, "0", "no", "Off", "false", '"false"', "")],
    ([{**IPMI, "options": {"plug": "{host}", "ssl_insecure": False}}], "ssl_insecure = '0' turns it on"),
    ([{**IPMI, "options": {"plug": "{host}", "port-as-ip": "no"}}], "option port-as-ip = 'no' turns it on"),
    ([{**IPMI, "options": {"ip": "127.0.0.5", "username": "admin"}}], "ip, ipaddr holds {host}"),
    ([{**IPMI, "hosts": "rack[12]", "options": {"ip": "127.0.0.5"}}], "ip, ipaddr holds {host}"),
    # {host} where the agent may never read it: the library drops nodename silently.
    ([{**IPMI, "options": {"plug": "vm-1", "nodename": "{host}", "username": "{host}"}}],
     "none of the options plug, port, ip, ipaddr holds {host}"),
    # One option to the library under two names: the later line wins.
    ([{**IPMI, "options": {"plug": "{host}", "port": 623}}], "options 'plug' and 'port' are one option"),
    ([{**IPMI, "options": {"plug": "{host}", "ip": "a", "ipaddr": "b"}}], "'ip' and 'ipaddr' are one"),
    ([{**IPMI, "options": {"plug": "{host}", "ssh_path": "/a"}, "secrets": {"ssh-path": "/b"}}],
     "'ssh_path' and 'ssh-path' are one"),
    ([{**IPMI, "options": {"action": "reboot"}}], "set by holdfast itself"),
    ([{**IPMI, "options": {"ip": "1.2.3.4\naction=on"}}], "newline"),
    ([{**IPMI, "options": {"ip": "1\r"}}], "newline"),
    ([{**IPMI, "options": {"Bad Name": "x"}}], "must match"),
    ([{**IPMI, "options": {"ip": ["a"]}}], "string, a number or a boolean"),
    ([{**IPMI, "options": ["ip"]}], "table of name = value"),
    ([{**IPMI, "secrets": {"password": "relative/file"}}], "absolute path of the file"),
    ([{**IPMI, "secrets": {"ip": "/x"}}], "both in options and in secrets"),
    ([IPMI, {**IPMI, "program": 7}], "fencer 2: program"),
])
def test_bad_fencer_settings_are_named(raw: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        fence_rules.parse_fencers(raw)


def test_host_in_the_plug_or_address_and_an_exact_host_without_placeholder_are_accepted() -> None:
    for name in fence_rules.ADDRESSING:
        spec, = fence_rules.parse_fencers([{**IPMI, "options": {name: "bmc-{host}", "lanplus": True}}])
        assert (name, "bmc-{host}") in spec.options
    spec, = fence_rules.parse_fencers([{**IPMI, "hosts": "node-7", "options": {"ip": "127.0.0.5"}}])
    assert spec.options == (("ip", "127.0.0.5"),)


def test_first_matching_fencer_answers() -> None:
    exact = FencerSpec("node-7", "/a")
    pattern = FencerSpec("node-*", "/b")
    assert fence_rules.fencer_for([exact, pattern], "node-7") is exact
    assert fence_rules.fencer_for([exact, pattern], "node-8") is pattern
    assert fence_rules.fencer_for([pattern, exact], "node-7") is pattern
    assert fence_rules.fencer_for([exact, pattern], "gpu-1") is None


def test_stdin_text_puts_the_action_first_and_the_host_in_place() -> None:
    spec, = fence_rules.parse_fencers([IPMI])
    options = fence_rules.agent_options(spec, "node-3", {"password": "s3cret"})
    assert fence_rules.stdin_text("off", options) == (
        "action=off\nip=127.0.0.5\nipport=623\nlanplus=1\nplug=node-3\nusername=admin\npassword=s3cret\n")
    with pytest.raises(ValueError, match="newline"):
        fence_rules.agent_options(spec, "node-3", {"password": "a\0b"})
    assert fence_rules.secret_of("s3cret\n") == "s3cret"
    assert fence_rules.secret_of("") == ""
    assert fence_rules.secret_of("one\ntwo\n") == "one"


def test_masking_hides_every_secret_longest_first_and_caps_length() -> None:
    assert fence_rules.mask("login admin:hunter2 hunter2x", ["hunter2", "hunter2x"]) == (
        f"login admin:{fence_rules.MASK} {fence_rules.MASK}")
    assert fence_rules.mask("nothing", ["", "zzz"]) == "nothing"
    assert len(fence_rules.mask("x" * 10_000, [])) == fence_rules.OUTPUT_KEPT


def act(action: str, exit_code: int = 0, stdout: str = "", ran: bool = True,
        timed_out: bool = False) -> pb.FenceAction:
    return pb.FenceAction(action=action, ran=ran, exit_code=exit_code, stdout=stdout, timed_out=timed_out,
                          error="" if ran else "No such file or directory")


OFF_OK = act("off", 0, "Success: Powered OFF\n")
STATUS_OFF = act("status", 2, "Status: OFF\n")


@pytest.mark.parametrize("off_line", ["Success: Powered OFF", "Success: Already OFF"])
def test_proof_is_off_then_status_off_exactly(off_line: str) -> None:
    off = act("off", 0, f"some log line\n{off_line}\n")
    assert fence_rules.needs_status(off)
    assert fence_rules.judge(off, STATUS_OFF)[0] is Answer.OFF


OFFS = [OFF_OK, act("off", 1, "Failed: Unable to obtain correct plug status\n"),
        act("off", 0, "Success: Powered ON\n"), act("off", 0, ""), act("off", 2, "Success: Powered OFF\n"),
        act("off", ran=False), act("off", 0, "Success: Powered OFF\n", timed_out=True),
        act("off", 0, "Success: Powered OFFish\n")]
STATUSES = [None, STATUS_OFF, act("status", 0, "Status: ON\n"), act("status", 0, "Status: OFF\n"),
            act("status", 2, "Status: ON\n"), act("status", 2, ""), act("status", 1, "Status: OFF\n"),
            act("status", 2, "Status: OFF\nStatus: ON\n"), act("status", ran=False),
            act("status", 2, "Status: OFF\n", timed_out=True)]


@pytest.mark.parametrize(("off", "status"), list(itertools.product(OFFS, STATUSES)))
def test_anything_but_the_exact_pair_proves_nothing(off: pb.FenceAction,
                                                    status: pb.FenceAction | None) -> None:
    answer, why = fence_rules.judge(off, status)
    proven = off is OFF_OK and status is STATUS_OFF
    assert (answer is Answer.OFF) == proven, why
    if answer is Answer.ON:
        assert off is OFF_OK and status is not None and status.exit_code == 0
    assert why
    assert fence_rules.needs_status(off) == (off is OFF_OK)


def test_an_on_answer_is_reported_as_on() -> None:
    assert fence_rules.judge(OFF_OK, act("status", 0, "Status: ON\n")) == (
        Answer.ON, "status after off reports the host ON")


# Two machine ids that each name one machine (machine-id(5)): an invalid one proves no end.
MACHINE, OTHER_MACHINE = "0f" * 16, "a1" * 16


def inc(boot: str = "b1") -> apb.HostIncarnation:
    return apb.HostIncarnation(machine_id=MACHINE, boot_id=boot, pid_ns=4026531836, ns_init_start_ticks=5)


def owned(host: str, claim: int = pb.LIVE, boot: str = "b1", stage: int = pb.NONE) -> pb.SessionRecord:
    record = pb.SessionRecord(session_id="sess-0001")
    record.lease.claim_status = claim
    record.lease.handoff_stage = stage
    record.lease.fence = 4
    record.lease.owner.host_id = host
    record.lease.owner.incarnation.CopyFrom(inc(boot))
    return record


def reserved(host: str) -> pb.SessionRecord:
    record = pb.SessionRecord(session_id="sess-0002")
    record.lease.claim_status = pb.RESERVED
    record.lease.reserved_host_id = host
    return record


def test_only_freeable_owners_and_reservations_name_a_host() -> None:
    assert fence_rules.freeable(owned("h1")) == "h1"
    assert fence_rules.freeable(owned("h1", pb.COMMITTED)) == "h1"
    assert fence_rules.freeable(owned("h1", pb.CONFLICTED)) == ""
    assert fence_rules.freeable(owned("h1", pb.RELEASED)) == ""
    assert fence_rules.freeable(owned("h1", stage=pb.MANUAL_RECOVERY)) == ""
    assert fence_rules.freeable(owned("h1", stage=pb.HANDOFF_REQUESTED)) == "h1"
    assert fence_rules.freeable(reserved("h2")) == "h2"
    assert fence_rules.hosts_named([owned("h1"), reserved("h2"), owned("h3", pb.CONFLICTED)]) == {"h1", "h2"}


@pytest.mark.parametrize(("since", "now", "retry_at", "expected"), [
    (None, 100.0, None, False),        # registered (or never seen absent)
    (95.0, 100.0, None, True),         # absent exactly host_loss_after
    (96.0, 100.0, None, False),        # not long enough
    (90.0, 100.0, 101.0, False),       # still backing off
    (90.0, 100.0, 100.0, True),        # backoff over
])
def test_time_only_makes_a_candidate(since: float | None, now: float, retry_at: float | None,
                                     expected: bool) -> None:
    assert fence_rules.due(since, now, 5.0, retry_at) is expected


def test_lost_for_and_backoff() -> None:
    assert fence_rules.lost_for(None, 10.0) == 0.0
    assert fence_rules.lost_for(4.0, 10.0) == 6.0
    assert fence_rules.lost_for(12.0, 10.0) == 0.0
    assert [fence_rules.backoff(n, 1.0) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert fence_rules.backoff(0, 2.0) == 2.0
    assert fence_rules.backoff(40, 1.0) == fence_rules.MAX_BACKOFF_S
    # The taint fencer waits for a person's taint: asked again at the first interval, never slower.
    assert [fence_rules.backoff(n, 3.0, fence_rules.KUBERNETES) for n in (1, 5, 40)] == [3.0, 3.0, 3.0]
    assert fence_rules.backoff(3, 900.0) == 900.0  # a first backoff above the cap is kept


LAST = pb.HostRegistration(host_id="h1", incarnation=inc())
OPEN = Gates(registered=False, draining=False, restore_pending=False, pending=False, last=LAST, fenced=None)


@pytest.mark.parametrize(("change", "says"), [
    ({"registered": True}, "live agent registration"),
    ({"draining": True}, "draining"),
    ({"restore_pending": True}, "restore-epoch"),
    ({"pending": True}, "already running"),
    ({"last": None}, "recover-host"),
])
def test_a_fence_starts_only_with_every_gate_open(change: dict[str, object], says: str) -> None:
    assert fence_rules.refusal(OPEN) == ""
    assert says in fence_rules.refusal(Gates(**{**OPEN.__dict__, **change}))


def test_an_operator_may_fence_a_draining_or_restore_gated_host_and_nothing_else_more() -> None:
    # While a restore is pending only an operator fences: the proof is how restore-epoch counts a
    # node it cannot search (it has no agent) as off since the restore.
    assert fence_rules.refusal(Gates(**{**OPEN.__dict__, "draining": True}), manual=True) == ""
    assert fence_rules.refusal(Gates(**{**OPEN.__dict__, "restore_pending": True}), manual=True) == ""
    for change in ({"registered": True}, {"pending": True}, {"last": None}):
        assert fence_rules.refusal(Gates(**{**OPEN.__dict__, **change}), manual=True)


def test_already_fenced_only_for_the_same_incarnation() -> None:
    fenced = pb.FenceAttempt(host_id="h1", incarnation=inc(), answer="off")
    assert not fence_rules.already_fenced(OPEN)
    assert fence_rules.already_fenced(Gates(**{**OPEN.__dict__, "fenced": fenced}))
    newer = pb.HostRegistration(host_id="h1", incarnation=inc("b2"))
    assert not fence_rules.already_fenced(Gates(**{**OPEN.__dict__, "fenced": fenced, "last": newer}))


def test_registration_refused_while_pending_and_for_the_fenced_incarnation_only() -> None:
    fenced = pb.FenceAttempt(host_id="h1", incarnation=inc(), answer="off")
    assert "cannot be called back" in fence_rules.registration_refused(inc(), True, None)
    assert "lied" in fence_rules.registration_refused(inc(), False, fenced)
    assert fence_rules.registration_refused(inc("b2"), False, fenced) == ""
    assert fence_rules.registration_refused(inc(), False, None) == ""
    for field, other in (("machine_id", OTHER_MACHINE), ("pid_ns", 1), ("ns_init_start_ticks", 6)):
        moved = inc()
        setattr(moved, field, other)
        assert not fence_rules.same_incarnation(moved, inc())


def test_the_proof_frees_the_fenced_incarnation_earlier_ended_ones_and_earlier_reservations_only() -> None:
    fenced = pb.FenceAttempt(host_id="h1", incarnation=inc(), answer="off")
    assert fence_rules.recoverable(owned("h1"), "h1", fenced, 10, 20)
    assert fence_rules.recoverable(owned("h1"), "h1", fenced, 30, 20)  # an old owner, rewritten since
    # Another boot of the machine, recorded before the proof: an earlier boot, which the fenced one
    # ended. Recorded after it: a new incarnation's owner, untouched.
    assert fence_rules.recoverable(owned("h1", boot="b0"), "h1", fenced, 10, 20)
    assert not fence_rules.recoverable(owned("h1", boot="b2"), "h1", fenced, 30, 20)
    # An earlier incarnation the fenced one does not prove ended: another machine, or another
    # PID namespace of the same boot (it may still exist beside the one fenced).
    elsewhere, beside = owned("h1"), owned("h1")
    elsewhere.lease.owner.incarnation.machine_id = OTHER_MACHINE
    beside.lease.owner.incarnation.pid_ns = 4026532000
    assert not fence_rules.recoverable(elsewhere, "h1", fenced, 10, 20)
    assert not fence_rules.recoverable(beside, "h1", fenced, 10, 20)
    reused = owned("h1")
    reused.lease.owner.incarnation.ns_init_start_ticks = 3  # the inode given to the fenced namespace
    assert fence_rules.recoverable(reused, "h1", fenced, 10, 20)
    assert not fence_rules.recoverable(reused, "h1", fenced, 30, 20)
    assert not fence_rules.recoverable(owned("h2"), "h1", fenced, 10, 20)
    assert not fence_rules.recoverable(owned("h1", pb.CONFLICTED), "h1", fenced, 10, 20)
    assert not fence_rules.recoverable(owned("h1", stage=pb.MANUAL_RECOVERY), "h1", fenced, 10, 20)
    assert fence_rules.recoverable(reserved("h1"), "h1", fenced, 10, 20)
    assert not fence_rules.recoverable(reserved("h1"), "h1", fenced, 30, 20)  # a new incarnation's


def test_evidence_names_program_actions_coordinator_and_time() -> None:
    attempt = pb.FenceAttempt(host_id="h1", program="/usr/sbin/fence_ipmilan", coordinator="c1:42",
                              requested_by=fence_rules.HOST_LOST, ended_at_unix_ms=99,
                              actions=[OFF_OK, STATUS_OFF], answer="off")
    detail = fence_rules.evidence_detail(attempt)
    assert detail == ("host h1 fenced by /usr/sbin/fence_ipmilan (off: exit 0 'Success: Powered OFF'; "
                      "status: exit 2 'Status: OFF') from c1:42 at 99 ms; host lost")
    assert "timed out" in fence_rules.evidence_detail(pb.FenceAttempt(actions=[act("off", timed_out=True)]))
    assert "not run" in fence_rules.evidence_detail(pb.FenceAttempt(actions=[act("off", ran=False)]))


def test_failures_count_consecutive_unproven_attempts() -> None:
    assert fence_rules.failures_after(pb.FenceAttempt(answer="unknown", failures=2)) == 3
    assert fence_rules.failures_after(pb.FenceAttempt(answer="on", failures=0)) == 1
    assert fence_rules.failures_after(pb.FenceAttempt(answer="off", failures=5)) == 0


def test_the_documented_fencers_are_valid_settings() -> None:
    """docs/operations.md's example parses as TOML and as fencers, one per agent it shows."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    block = text.split("### A lost host is fenced", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    table = tomllib.loads(block)["coordinator"]
    specs = fence_rules.parse_fencers(table["fencers"])
    assert [spec.program.rsplit("/", 1)[1] for spec in specs] == [
        "fence_ipmilan", "fence_redfish", "fence_aws", "fence_gce", "fence_kubevirt"]
    assert fence_rules.fencer_for(specs, "rack2-7") is specs[1]
    assert ("password", "/etc/holdfast/fence/redfish-password") in specs[1].secrets


# --- the out-of-service taint ----------------------------------------------------------------------
UID, OTHER_UID = "0b7c5a6e-2f55-4a8e-9a7b-3c1d2e4f5a6b", "9f0e1d2c-3b4a-4596-8778-695a4b3c2d1e"
TAINT = {"key": fence_rules.OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute",
         "timeAdded": "2027-01-15T08:00:01Z"}


def node(uid: str = UID, taints: list[dict[str, str | None]] | None = None,
         ready: str = "Unknown") -> dict[str, object]:
    return {"metadata": {"name": "n1", "uid": uid}, "spec": {"taints": [TAINT] if taints is None else taints},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": ready}]}}


def test_the_taint_fencer_parses_with_api_options_only() -> None:
    spec, = fence_rules.parse_fencers([{"hosts": "*", "kind": fence_rules.KUBERNETES,
                                        "options": {"api_server": "https://127.0.0.1:6443"}}])
    assert spec == FencerSpec("*", fence_rules.KUBE_PROGRAM, (("api_server", "https://127.0.0.1:6443"),),
                              kind=fence_rules.KUBERNETES)
    assert fence_rules.parse_fencers([{"hosts": "*", "kind": fence_rules.KUBERNETES}])[0].options == ()
    for bad, says in [({"program": "/usr/sbin/fence_ipmilan"}, "takes no program"),
                      ({"secrets": {"token": "/t"}}, "takes no secrets"),
                      ({"options": {"plug": "{host}"}}, "unknown option 'plug'")]:
        with pytest.raises(ValueError, match=says):
            fence_rules.parse_fencers([{"hosts": "*", "kind": fence_rules.KUBERNETES, **bad}])
    with pytest.raises(ValueError, match="kind must be"):
        fence_rules.parse_fencers([{**IPMI, "kind": "stonith"}])


def looked(*found: dict[str, object] | None) -> fence_rules.TaintSightings:
    """The sightings of reads after the lapse that found these Nodes."""
    sightings = fence_rules.TaintSightings()
    for seen in found:
        sightings.saw(seen)
    return sightings


def test_the_taint_proves_only_on_the_enrolled_uid_once_a_read_missed_it_on_a_node_not_ready() -> None:
    untainted = looked(node(taints=[]))
    answer, detail, seen = fence_rules.judge_taint(node(), "n1", UID, untainted)
    assert answer is Answer.OFF, detail
    assert seen == (f"Node n1 uid {UID}: taint {fence_rules.OUT_OF_SERVICE}=nodeshutdown:NoExecute added "
                    "2027-01-15T08:00:01Z; Ready Unknown")
    assert fence_rules.judge_taint(node(ready="False"), "n1", UID, untainted)[0] is Answer.OFF
    again = {**TAINT, "timeAdded": "2027-01-15T09:30:00Z"}  # removed after the first read, added again
    assert fence_rules.judge_taint(node(taints=[again]), "n1", UID, looked(node()))[0] is Answer.OFF
    # Any clock's reading is beside the point: a leftover taint stamped in the future by a clock
    # ahead of the replica's is found by the first read and proves nothing.
    future = {**TAINT, "timeAdded": "2099-01-01T00:00:00Z"}
    cases = {
        "no Node uid": fence_rules.judge_taint(node(), "n1", "", untainted),
        "the first read of Node n1": fence_rules.judge_taint(node(), "n1", UID, fence_rules.TaintSightings()),
        "a deleted Node is not proof": fence_rules.judge_taint(None, "n1", UID, untainted),
        "another machine took the name": fence_rules.judge_taint(node(OTHER_UID), "n1", UID, untainted),
        "has no node.kubernetes.io/out-of-service taint": fence_rules.judge_taint(node(taints=[]), "n1", UID,
                                                                                  untainted),
        "has no timeAdded": fence_rules.judge_taint(node(taints=[{**TAINT, "timeAdded": None}]), "n1", UID,
                                                    untainted),
        "was already there": fence_rules.judge_taint(node(), "n1", UID, looked(node(taints=[]), node())),
        "was already there when": fence_rules.judge_taint(node(taints=[future]), "n1", UID,
                                                          looked(node(taints=[future]))),
    }
    for says, (answer, detail, _) in cases.items():
        assert answer is Answer.UNKNOWN and says in detail, (says, detail)
    answer, detail, _ = fence_rules.judge_taint(node(ready="True"), "n1", UID, untainted)
    assert answer is Answer.ON and "Ready" in detail


def test_a_read_that_found_no_node_still_counts_as_a_look() -> None:
    sightings = looked(None)
    assert sightings.looked and not sightings.added
    assert fence_rules.judge_taint(node(), "n1", UID, sightings)[0] is Answer.OFF


def test_taint_evidence_names_the_taint() -> None:
    _, _, seen = fence_rules.judge_taint(node(), "n1", UID, looked(node(taints=[])))
    attempt = pb.FenceAttempt(host_id="n1", program=fence_rules.KUBE_PROGRAM, coordinator="c1:42",
                              requested_by=fence_rules.HOST_LOST, ended_at_unix_ms=99, answer="off",
                              actions=[pb.FenceAction(action=fence_rules.READ_NODE, ran=True, stdout=seen)])
    detail = fence_rules.evidence_detail(attempt)
    assert detail.startswith(f"host n1 fenced by the Kubernetes taint {fence_rules.OUT_OF_SERVICE} "
                             f"(read-node: Node n1 uid {UID}: taint {fence_rules.OUT_OF_SERVICE}=")


def test_the_documented_taint_fencer_is_a_valid_setting() -> None:
    """docs/operations.md's Kubernetes example parses as TOML and as the taint fencer for every host."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    block = text.split("#### On Kubernetes: the out-of-service taint", 1)[1].split("```toml\n", 1)[1]
    spec, = fence_rules.parse_fencers(tomllib.loads(block.split("```", 1)[0])["coordinator"]["fencers"])
    assert spec.kind == fence_rules.KUBERNETES and fence_rules.fencer_for([spec], "any-node") is spec


def test_the_taint_fencer_is_not_tried_for_a_host_that_enrolled_with_no_node_uid() -> None:
    kube = FencerSpec("*", fence_rules.KUBE_PROGRAM, kind=fence_rules.KUBERNETES)
    assert "names no Node uid" in fence_rules.unprovable(kube, pb.HostRegistration(host_id="h1"))
    assert fence_rules.unprovable(kube, pb.HostRegistration(host_id="h1", node_uid=UID)) == ""
    assert fence_rules.unprovable(FencerSpec("*", "/usr/sbin/fence_ipmilan"), pb.HostRegistration()) == ""
