"""Whether a tree can leave its session cgroup (proc/cgroups_rules.py): CGROUP_ONLY only where no
credential its gate has or can regain writes a cgroup.procs at or above its cgroup's parent, and Yama
keeps its ptrace to its own descendants."""

from __future__ import annotations

import pytest

from holdfast.proc import cgroups_rules
from holdfast.proc.cgroups_rules import Credentials, Descriptor, Inode, may_write
from holdfast.v1 import agent_pb2

ONLY, AND_SCAN = agent_pb2.CGROUP_ONLY, agent_pb2.CGROUP_AND_SCAN
NOBODY = 65534
CAP_DAC_OVERRIDE = 1 << 1
ROOT_OWNED = Inode(0, 0, 0o100644)  # cgroup.procs as the kernel makes it
PROCS = [("/sys/fs/cgroup/unified/cgroup.procs", ROOT_OWNED)]
MOUNTS = {24: "devtmpfs", 27: "ext4", 31: "cgroup2"}


def status(**kw: str) -> dict[str, str]:
    """/proc/<pid>/status fields of a nobody gate started with no-new-privileges and nothing else."""
    ids = "\t".join([str(NOBODY)] * 4)
    base = {"Uid": ids, "Gid": ids, "Groups": "", "NoNewPrivs": "1", "CapInh": "0000000000000000",
            "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
            "CapBnd": "000001ffffffffff", "CapAmb": "0000000000000000"}
    return {**base, **kw}


def proof(fields: dict[str, str], procs: list[tuple[str, Inode]] = PROCS,
          descriptors: tuple[Descriptor, ...] = (), mounts: dict[int, str] = MOUNTS,
          ptrace_scope: int | None = 1) -> int:
    return cgroups_rules.tree_proof(cgroups_rules.credentials(fields), descriptors, mounts, procs,
                                    ptrace_scope)[0]


def test_a_gate_with_no_way_to_any_cgroup_procs_is_held_by_its_cgroup() -> None:
    assert proof(status()) == ONLY


@pytest.mark.parametrize(("scope", "expected"), [(None, AND_SCAN), (0, AND_SCAN), (1, ONLY), (2, ONLY),
                                                 (3, ONLY)], ids=["absent", "0", "1", "2", "3"])
def test_a_tree_that_may_attach_to_processes_outside_it_needs_the_scan_too(scope: int | None,
                                                                           expected: int) -> None:
    """Without Yama, or at scope 0, a process of the tree may take a cgroup.procs that a process of
    its uid outside it holds open (pidfd_getfd) — its root starter opened it for writing — and leave."""
    decided, why = cgroups_rules.tree_proof(cgroups_rules.credentials(status()), (), MOUNTS, PROCS, scope)
    assert decided == expected, why
    if expected == AND_SCAN:
        assert "may be ptraced (kernel.yama.ptrace_scope is" in why, why


def test_the_gates_own_way_out_is_named_whatever_yamas_scope() -> None:
    held = Descriptor("/sys/fs/cgroup/unified/cgroup.procs", 0o100001, 31)
    why = cgroups_rules.tree_proof(cgroups_rules.credentials(status()), (held,), MOUNTS, PROCS, None)[1]
    assert "open for writing" in why, why


@pytest.mark.parametrize(("fields", "why"), [
    ({"NoNewPrivs": "0"}, "an exec of a setuid program or of file capabilities may gain privileges"),
    # systemd's User=, NoNewPrivileges=yes, AmbientCapabilities=CAP_DAC_OVERRIDE
    ({"CapPrm": "0000000000000002", "CapEff": "0000000000000002", "CapAmb": "0000000000000002"},
     "CAP_DAC_OVERRIDE writes any cgroup.procs"),
    ({"CapPrm": "0000000000200000"}, "CAP_SYS_ADMIN permitted, raised to effective at will"),
    ({"CapAmb": "0000000000000008"}, "an ambient capability (CAP_FOWNER) alone"),
    ({"Uid": f"{NOBODY}\t{NOBODY}\t0\t{NOBODY}"}, "setresuid back to a saved uid 0"),
    ({"Uid": f"0\t{NOBODY}\t{NOBODY}\t{NOBODY}"}, "setresuid back to a real uid 0"),
    ({"Uid": f"{NOBODY}\t{NOBODY}\t{NOBODY}\t0"}, "a fs uid 0 writes as root"),
    # root with CAP_SYS_ADMIN dropped from its bounding set and a read-only cgroup2 mount: it may still
    # write through /proc/<pid>/root of a process in another mount namespace
    ({"Uid": "0\t0\t0\t0", "Gid": "0\t0\t0\t0", "CapBnd": "000001ffffdfffff"}, "uid 0, whatever its mounts"),
])
def test_a_gate_that_has_or_can_regain_a_way_out_needs_the_scan_too(fields: dict[str, str], why: str) -> None:
    assert proof(status(**fields)) == AND_SCAN, why


@pytest.mark.parametrize(("inode", "fields", "writable"), [
    (Inode(NOBODY, 0, 0o100444), {}, True),  # its owner may chmod it
    (Inode(NOBODY, 0, 0o100000), {}, True),
    (Inode(1000, 1000, 0o100644), {"Uid": f"{NOBODY}\t{NOBODY}\t1000\t{NOBODY}"}, True),  # a saved uid
    (Inode(0, 100, 0o100664), {"Groups": "100"}, True),
    (Inode(0, 100, 0o100664), {"Gid": f"{NOBODY}\t{NOBODY}\t100\t{NOBODY}"}, True),  # a saved gid
    (Inode(0, 100, 0o100646), {}, True),  # others may write
    (Inode(0, 100, 0o100644), {"Groups": "100"}, False),  # its group may not
    (Inode(0, 100, 0o100664), {}, False),  # a group it is not in
    (Inode(1000, 1000, 0o100600), {}, False),
])
def test_a_cgroup_procs_is_writable_by_its_owner_whatever_its_mode_and_else_by_its_mode(
        inode: Inode, fields: dict[str, str], writable: bool) -> None:
    who = cgroups_rules.credentials(status(**fields))
    assert may_write(inode, who) is writable
    assert proof(status(**fields), [*PROCS, ("/sys/fs/cgroup/unified/pod/cgroup.procs", inode)]) == (
        AND_SCAN if writable else ONLY)


def test_uid_0_writes_anything() -> None:
    root = Credentials(no_new_privs=True, capabilities=0, uids=frozenset({0}), gids=frozenset({0}))
    assert may_write(Inode(1000, 1000, 0o100000), root)


@pytest.mark.parametrize(("held", "writes"), [
    # a root shell's `>/sys/fs/cgroup/cgroup.procs` before it dropped to nobody: root's credentials
    (Descriptor("/sys/fs/cgroup/unified/cgroup.procs", 0o100001, 31), True),
    (Descriptor("/sys/fs/cgroup/unified/cgroup.procs", 0o100002, 31), True),
    (Descriptor("/sys/fs/cgroup/unified/cgroup.procs", 0o102001, 31), True),  # O_APPEND too
    (Descriptor("/elsewhere/cgroup.procs", 0o100001, 999), True),  # a mount of another namespace
    # read-only: writing means a reopen, checked with the gate's own credentials
    (Descriptor("/sys/fs/cgroup/unified/cgroup.procs", 0o100000, 31), False),
    (Descriptor("/sys/fs/cgroup/unified", 0o12100000, 31), False),  # O_PATH
    (Descriptor("/var/log/run.log", 0o102001, 27), False),
    (Descriptor("pipe:[11076419]", 0o1, 16), False),
    (Descriptor("socket:[11076420]", 0o2, 9), False),
])
def test_a_descriptor_writes_with_its_openers_credentials(held: Descriptor, writes: bool) -> None:
    assert cgroups_rules.writes_cgroups(held, MOUNTS) is writes
    assert proof(status(), descriptors=(held,)) == (AND_SCAN if writes else ONLY)


def test_a_descriptor_opened_in_another_mount_namespace_is_placed_by_that_namespaces_mounts() -> None:
    log = Descriptor("/var/log/job.log", 0o102001, 999)  # a service manager's StandardOutput=file:
    assert cgroups_rules.unplaced([log], MOUNTS)
    assert not cgroups_rules.unplaced([log], {**MOUNTS, 999: "ext4"})
    assert proof(status(), descriptors=(log,), mounts={**MOUNTS, 999: "ext4"}) == ONLY
    assert proof(status(), descriptors=(log,), mounts={**MOUNTS, 999: "cgroup2"}) == AND_SCAN
    # what writes no file needs no placing
    assert not cgroups_rules.unplaced([Descriptor("/x", 0o100000, 999), Descriptor("pipe:[1]", 1, 998),
                                       Descriptor("/y", 0o12000002, 997)], MOUNTS)


def test_nothing_read_above_the_cgroup_proves_nothing() -> None:
    assert proof(status(), procs=[]) == AND_SCAN


@pytest.mark.parametrize("fields", [
    {"Uid": f"{NOBODY}\t{NOBODY}\t{NOBODY}"}, {"Gid": "x\t1\t1\t1"}, {"CapAmb": "zz"},
])
def test_credentials_that_do_not_parse_are_an_error(fields: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        cgroups_rules.credentials(status(**fields))


@pytest.mark.parametrize("missing", ["NoNewPrivs", "CapPrm", "CapAmb", "Uid", "Gid", "Groups"])
def test_a_missing_credential_is_an_error(missing: str) -> None:
    fields = status()
    del fields[missing]
    with pytest.raises(KeyError):
        cgroups_rules.credentials(fields)


def test_the_ancestors_run_from_the_parent_to_the_root() -> None:
    root = "/sys/fs/cgroup/unified"
    assert cgroups_rules.ancestors(f"{root}/pod/holdfast-s-1-0a0b0c0d", root) == [f"{root}/pod", root]
    assert cgroups_rules.ancestors(f"{root}/holdfast-s-1-0a0b0c0d", root + "/") == [root]
    assert cgroups_rules.ancestors("/a/b", "/") == ["/a", "/"]
    assert cgroups_rules.ancestors(f"{root}x/holdfast-s-1-0a0b0c0d", root) == []


def test_mount_types_are_read_from_mountinfo() -> None:
    text = ("24 1 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw\n"
            "31 25 0:27 / /sys/fs/cgroup/unified ro,nosuid,nodev shared:9 - cgroup2 cgroup2 rw,nsdelegate\n")
    assert cgroups_rules.mount_types(text) == {24: "devtmpfs", 31: "cgroup2"}
