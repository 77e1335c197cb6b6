"""Whether a /proc listing holds every process (proc/listing_rules.py), from mountinfo lines as
the kernel writes them: hidepid=invisible and ptraceable hide a process the reader may not
ptrace-read, gid= exempts its members from invisible only, noaccess lists every process; and
the scan's read of this machine's mount table asks again when it names no mount of /proc."""

from __future__ import annotations

import pytest

from holdfast.proc import listing_rules, scan
from holdfast.proc.listing_rules import hidden

DEVICE = (0, 21)
ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"


def proc_line(options: str, device: str = "0:21", point: str = "/proc") -> str:
    return f"22 27 {device} / {point} rw,nosuid,nodev,noexec,relatime - proc proc {options}\n"


@pytest.mark.parametrize("options", ["rw", "rw,hidepid=off", "rw,hidepid=0", "rw,hidepid=noaccess",
                                     "rw,hidepid=1", "rw,gid=65534,hidepid=invisible"])
def test_a_listing_of_every_process_is_whole(options: str) -> None:
    assert hidden(ROOT + proc_line(options), DEVICE, {65534}) == ""


@pytest.mark.parametrize(("options", "said"), [
    ("rw,hidepid=invisible", "hidepid=invisible"),
    ("rw,hidepid=2", "hidepid=2"),
    ("rw,hidepid=ptraceable", "hidepid=ptraceable"),
    ("rw,hidepid=4", "hidepid=4"),
    ("rw,gid=1000,hidepid=invisible", "gid= group (1000)"),
    ("rw,gid=65534,hidepid=ptraceable", "exempts no one"),  # gid= does not exempt from ptraceable
    ("rw,subset=pid", "subset=pid"),
    ("rw,hidepid=8", "does not know"),
])
def test_a_listing_that_may_leave_a_live_process_out_is_not_whole(options: str, said: str) -> None:
    why = hidden(ROOT + proc_line(options), DEVICE, {65534})
    assert said in why and "/proc" in why


def test_the_mount_of_the_listed_device_decides_not_another_procfs() -> None:
    """`unshare --mount-proc` stacks a second procfs on /proc: the one the listing reads is told by
    its device, whichever line comes first."""
    stacked = ROOT + proc_line("rw") + proc_line("rw,hidepid=invisible", device="0:94")
    assert "hidepid=invisible" in hidden(stacked, (0, 94), set())
    assert hidden(stacked, DEVICE, set()) == ""


def test_a_directory_on_no_procfs_hides_nothing_and_an_unknown_device_is_not_whole() -> None:
    assert hidden(ROOT + proc_line("rw,hidepid=invisible"), (254, 0), set()) == ""
    assert "cannot be told" in hidden(ROOT, (0, 99), set())


def test_an_escaped_mount_point_is_named_as_the_kernel_means_it() -> None:
    why = hidden(proc_line("rw,hidepid=invisible", point="/my\\040proc"), DEVICE, set())
    assert why.startswith("/my proc is mounted hidepid=invisible")


def over(point: str, source: str = "254:0 /tmp/fake", kind: str = "ext4 /dev/vda rw") -> str:
    return f"40 22 {source} {point} rw,relatime - {kind}\n"


LXCFS = "0:50 /proc/loadavg"


@pytest.mark.parametrize("point", ["/proc/loadavg", "/proc/1234/environ", "/proc/1234",
                                   "/proc/1234/task/1235/stat"])
def test_a_mount_over_what_a_scan_reads_makes_the_listing_untrustworthy(point: str) -> None:
    """Over /proc/loadavg (LXCFS's) a pid wrap goes unseen; over /proc/<pid>, its stat and environ
    are the mounted file's, a live carrier read as none."""
    mounts = ROOT + proc_line("rw") + over(point, source=LXCFS, kind="fuse.lxcfs lxcfs rw")
    why = hidden(mounts, DEVICE, set())
    assert why.startswith(f"{point} is mounted over what a scan reads in /proc")


def test_mounts_over_what_a_scan_does_not_read_leave_the_listing_whole() -> None:
    """A container runtime's masks and read-only binds (/proc/kcore, /proc/sys, ...), and a mount
    beside /proc whose name only begins like it."""
    mounts = ROOT + proc_line("rw") + over("/proc/kcore", "0:5 /null", "devtmpfs udev rw") + \
        over("/proc/sys", "0:21 /sys", "proc proc rw") + over("/proc/acpi", "0:60 /", "tmpfs tmpfs ro") + \
        over("/proc2/loadavg") + over("/proc/1234x/environ")
    assert hidden(mounts, DEVICE, set()) == ""


def test_an_overmount_counts_under_the_procfs_listed_only() -> None:
    """A procfs bound a second time (at an escaped point): the mounts under the path listed count."""
    host = "/host\\040proc"
    mounts = ROOT + proc_line("rw") + proc_line("rw", point=host) + over(f"{host}/7/environ")
    assert hidden(mounts, DEVICE, set(), listed="/proc") == ""
    assert hidden(mounts, DEVICE, set(), listed="/host proc").startswith("/host proc/7/environ is mounted")


def test_a_mount_table_naming_no_mount_of_proc_is_read_again_before_it_stands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount table read while mounts came and went named no mount of /proc's device now and then,
    and every tree proof of that scan waited: it is read again; one that never names it still
    counts as hiding."""
    real = scan.read_proc_file
    reads: list[str] = []

    def first_empty(path: str) -> bytes:
        reads.append(path)
        return b"" if len(reads) == 1 else real(path)

    monkeypatch.setattr(scan, "read_proc_file", first_empty)
    assert scan.listing_hidden("/proc") == "" and len(reads) == 2
    monkeypatch.setattr(scan, "read_proc_file", lambda path: b"")
    assert listing_rules.unlisted(scan.listing_hidden("/proc"))
