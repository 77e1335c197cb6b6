"""Environ and stat parsing, and the scan over a /proc-shaped directory (the seeds' scenarios)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from holdfast.proc.environ import value_in_block
from holdfast.proc.procstat import StatParseError, parse_stat
from holdfast.proc.scan import scan

V = b"HOLDFAST_SPAWN_TOKEN"


@pytest.mark.parametrize(
    ("block", "value"),
    [
        (b"A=1\0HOLDFAST_SPAWN_TOKEN=abc\0B=2\0", b"abc"),
        (b"HOLDFAST_SPAWN_TOKEN=first\0", b"first"),  # at the start
        (b"A=1\0HOLDFAST_SPAWN_TOKEN=last", b"last"),  # no trailing NUL
        (b"HOLDFAST_SPAWN_TOKEN_EXTRA=no\0", None),  # prefix collision
        (b"X_HOLDFAST_SPAWN_TOKEN=no\0", None),  # suffix collision
        (b"A=HOLDFAST_SPAWN_TOKEN=no\0", None),  # inside another value
        (b"HOLDFAST_SPAWN_TOKEN=\0", b""),  # empty value
        (b"", None),
        (b"F=" + b"x" * 500_000 + b"\0HOLDFAST_SPAWN_TOKEN=deep\0", b"deep"),
    ],
)
def test_exact_variable_match(block: bytes, value: bytes | None) -> None:
    assert value_in_block(block, V) == value


def test_stat_counts_fields_after_the_last_paren() -> None:
    # A command name may hold ") S " itself; only the last ")" ends it.
    line = b"42 (a) b) S c) R 41 " + b"0 " * 17 + b"123456 0 0\n"
    st = parse_stat(line)
    assert (st.state, st.ppid, st.start_ticks) == ("R", 41, 123456)


@pytest.mark.parametrize("line", [b"42 no paren S", b"42 (x) S 1 2"])
def test_stat_parse_failures_raise(line: bytes) -> None:
    with pytest.raises(StatParseError):
        parse_stat(line)


def fake_proc(root: Path, pid: int, ppid: int, environ: bytes | None, start_ticks: int | None = None,
              flags: int = 0, env_at: tuple[int, int] | None = None) -> None:
    d = root / str(pid)
    d.mkdir()
    if not (root / "loadavg").exists():  # the pid counter, read around each listing
        (root / "loadavg").write_bytes(b"0.00 0.00 0.00 1/1 1000\n")
    fields = ["S", str(ppid), "0", "0", "0", "0", str(flags)] + ["0"] * 12
    fields.append(str(pid * 10 if start_ticks is None else start_ticks))
    if env_at is not None:  # fields 23..49, then env_start and env_end (fields 50-51)
        fields += ["0"] * 27 + [str(env_at[0]), str(env_at[1])]
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "task" / str(pid) / "children").write_bytes(b"")
    (d / "stat").write_bytes(f"{pid} (p) {' '.join(fields)}\n".encode())
    if environ is not None:
        (d / "environ").write_bytes(environ)
    else:
        (d / "environ").write_bytes(b"")
        os.chmod(d / "environ", 0)


def test_scan_marks_roots_and_counts_unreadable(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    fake_proc(tmp_path, 10, 1, b"HOLDFAST_SPAWN_TOKEN=t1\0")
    fake_proc(tmp_path, 11, 10, b"HOLDFAST_SPAWN_TOKEN=t1\0")
    fake_proc(tmp_path, 12, 11, b"HOLDFAST_SPAWN_TOKEN=t2\0")  # child with another token: its own root
    fake_proc(tmp_path, 13, 1, b"HOLDFAST_SPAWN_TOKEN_EXTRA=t1\0")
    (tmp_path / "self").mkdir()
    result = scan(V, proc=str(tmp_path))
    assert {(c.pid, c.token, c.root) for c in result.carriers} == {
        (10, b"t1", True), (11, b"t1", False), (12, b"t2", True)}
    assert result.complete and result.scanned == 5
    assert sorted(c.pid for c in scan(V, b"t1", proc=str(tmp_path)).carriers) == [10, 11]


def test_unreadable_pid_makes_the_scan_incomplete() -> None:
    proc = Path(tempfile.mkdtemp(prefix="holdfast-fakeproc-"))  # traversable by nobody
    try:
        proc.chmod(0o755)
        fake_proc(proc, 1, 0, b"PATH=/bin\0")
        fake_proc(proc, 20, 1, None)
        pid = os.fork()
        if pid == 0:
            # root reads mode-0 files; the scan runs as nobody, as an unprivileged agent would.
            os.setuid(65534)
            r = scan(V, proc=str(proc))
            os._exit(0 if (r.enumerable and not r.complete and r.unreadable == 1 and r.scanned == 2) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        shutil.rmtree(proc)


def test_only_unreadable_processes_younger_than_the_root_leave_its_tree_unproven() -> None:
    proc = Path(tempfile.mkdtemp(prefix="holdfast-fakeproc-"))
    try:
        proc.chmod(0o755)
        fake_proc(proc, 1, 0, None)    # an unreadable init, started at tick 10
        fake_proc(proc, 20, 1, None)   # unreadable, started at tick 200
        fake_proc(proc, 30, 1, None)
        os.chmod(proc / "30" / "stat", 0)  # not even its start is known: always a possible member
        pid = os.fork()
        if pid == 0:
            os.setuid(65534)
            r = scan(V, proc=str(proc))
            counts = [r.unreadable_since(ticks) for ticks in (0, 11, 200, 201)]
            os._exit(0 if (r.unreadable == 3 and counts == [3, 2, 2, 1]) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        shutil.rmtree(proc)


def test_no_proc_is_not_enumerable_never_an_empty_answer(tmp_path: Path) -> None:
    r = scan(V, proc=str(tmp_path / "missing"))
    assert not r.enumerable and not r.complete and r.carriers == []


def test_a_pid_listed_then_gone_leaves_every_pass_unsettled(tmp_path: Path) -> None:
    # A listed pid whose stat is gone (a hopper's parent that exited after readdir): it may have
    # forked a child the listing missed, so no pass settles and absence is never claimed.
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    (tmp_path / "77").mkdir()
    r = scan(V, b"t1", proc=str(tmp_path), max_passes=3)
    assert not r.stable and not r.complete and r.passes == 3 and r.carriers == []


@pytest.mark.parametrize("counter", ["wrapped", "blank", "missing"])
def test_a_pid_counter_that_wrapped_or_went_unread_during_the_listing_leaves_it_unsettled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counter: str) -> None:
    # A child born behind the listing's walk (pids wrapped) to a parent that then exited ahead of it
    # is listed by neither; only the counter tells. Here, as each listing is made, the counter goes
    # down by one (wrapped), reads blank, or its file is gone.
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    listdir, loadavg = os.listdir, tmp_path / "loadavg"

    def listing_while_pids_move(path: str) -> list[str]:
        entries = listdir(path)
        if path == str(tmp_path) and loadavg.exists():
            if counter == "missing":
                loadavg.unlink()
            else:
                lower = int(loadavg.read_bytes().split()[-1]) - 1 if counter == "wrapped" else ""
                loadavg.write_bytes(f"0.00 0.00 0.00 1/1 {lower}\n".encode())
        return entries

    monkeypatch.setattr(os, "listdir", listing_while_pids_move)
    r = scan(V, b"t1", proc=str(tmp_path), max_passes=3)
    assert not r.stable and not r.complete and r.passes == 3
    monkeypatch.undo()
    loadavg.write_bytes(b"0.00 0.00 0.00 1/1 1001\n")  # only ascended: the same tree settles
    assert scan(V, b"t1", proc=str(tmp_path)).stable


def test_a_process_born_after_the_listing_holds_a_reused_pid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    fake_proc(tmp_path, 5, 1, b"PATH=/bin\0", start_ticks=1 << 60)  # started after the listing
    assert not scan(V, proc=str(tmp_path), max_passes=2).stable
    (tmp_path / "5" / "stat").unlink()
    shutil.rmtree(tmp_path / "5")
    settled = scan(V, proc=str(tmp_path))
    assert settled.stable and settled.passes == 1


def test_an_empty_environ_settles_only_when_seen_twice_but_a_kernel_threads_at_once(tmp_path: Path) -> None:
    # An environ laid out but read empty (its memory unmapped): unknown, settled when seen twice.
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    fake_proc(tmp_path, 2, 0, b"", flags=0x00200000)  # a kernel thread: never a carrier
    assert scan(V, proc=str(tmp_path)).passes == 1
    fake_proc(tmp_path, 30, 1, b"", env_at=(140726680158187, 140726680158299))
    r = scan(V, b"t1", proc=str(tmp_path))
    assert r.stable and r.passes == 2, "settled only once the second pass saw it unchanged"


def test_a_process_in_the_middle_of_an_execve_never_settles_a_pass(tmp_path: Path) -> None:
    # No environ laid out yet (0, 0): an execve between its new memory and its new environ. It
    # may be a carrier a moment later, so seeing it so in every pass proves nothing (a gate being
    # attested was once missed so, in two quick passes over a small namespace).
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    fake_proc(tmp_path, 31, 1, b"", env_at=(0, 0))
    r = scan(V, b"t1", proc=str(tmp_path), max_passes=5)
    assert not r.stable and r.passes == 5


def test_an_empty_environ_never_vouches_for_a_later_pass_and_a_missed_child_unsettles(tmp_path: Path) -> None:
    # Seen empty (mid-execve) in one pass and gone in the next: it was alive, what it carried is
    # unknown, and it may have forked after the listing. Not settled.
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    fake_proc(tmp_path, 40, 1, b"")
    (tmp_path / "40" / "task" / "40" / "children").write_bytes(b"41 ")  # a child the listing lacks
    r = scan(V, b"t1", proc=str(tmp_path), max_passes=3)
    assert not r.stable and r.passes == 3



def test_a_process_started_without_environ_is_known_to_carry_nothing(tmp_path: Path) -> None:
    # `env -i`: the environ is laid out, and empty (env_start == env_end): settled at once; one
    # whose environ is not laid out (0, 0: mid-execve, exiting) is unknown until it resolves.
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0")
    fake_proc(tmp_path, 30, 1, b"", env_at=(140726680158187, 140726680158187))
    assert scan(V, b"t1", proc=str(tmp_path)).passes == 1
    fake_proc(tmp_path, 31, 1, b"", env_at=(0, 0))
    assert not scan(V, b"t1", proc=str(tmp_path), max_passes=3).stable


def test_a_tree_scan_reads_no_process_older_than_its_roots(tmp_path: Path) -> None:
    """A process that started before every root looked for cannot be a descendant: its environ is
    not read (unreadable, it leaves the scan complete) and it is never reported; one started in
    the root's tick or later is read as before."""
    fake_proc(tmp_path, 1, 0, b"PATH=/bin\0", start_ticks=10)
    fake_proc(tmp_path, 20, 1, b"HOLDFAST_SPAWN_TOKEN=t1\0", start_ticks=299)  # older, handed the token
    fake_proc(tmp_path, 21, 1, None, start_ticks=100)                          # older, unreadable
    fake_proc(tmp_path, 30, 1, b"HOLDFAST_SPAWN_TOKEN=t1\0", start_ticks=300)  # the root, same tick
    fake_proc(tmp_path, 31, 30, b"HOLDFAST_SPAWN_TOKEN=t1\0", start_ticks=450)
    fake_proc(tmp_path, 40, 1, b"HOLDFAST_SPAWN_TOKEN=t1\0", start_ticks=500)  # started beside it
    tree = scan(V, b"t1", proc=str(tmp_path), born_since=300)
    assert sorted(c.pid for c in tree.carriers) == [30, 31, 40]
    assert tree.complete and tree.older == 3 and tree.scanned == 3
    everything = scan(V, b"t1", proc=str(tmp_path))
    assert sorted(c.pid for c in everything.carriers) == [20, 30, 31, 40] and not everything.complete
