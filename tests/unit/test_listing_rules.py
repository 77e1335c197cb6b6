"""Whether a /proc listing holds every process (proc/listing_rules.py), from mountinfo lines as
the kernel writes them: hidepid=invisible and ptraceable hide a process the reader may not
ptrace-read, gid= exempts its members from invisible only, noaccess lists every process."""

from __future__ import annotations

import pytest

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
