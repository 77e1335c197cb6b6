"""A stable scan of /proc: every process carrying a variable, which of them are tree roots, and
whether absence may be claimed from it (`complete`).

One pass is not enough to claim absence. A process listed by readdir and gone before it is read
may have forked a child after the listing: that child carries the token and was never listed (a
fork-hopping tree — parent forks, parent exits, child goes on — was declared gone by one pass in
198 of 200 tries). So a pass is *settled* only when every pid it listed was read alive, or is
unchanged since the pass before (same start ticks, and then it carried nothing: a zombie, or a
process read as a non-carrier), and the pid counter did not wrap during its listing (see
`pids_ascended`; a whole cycle of the pid space within one listing, pid_max pids handed out in its
millisecond or two, is not seen). Passes repeat until one is settled, within a bound of passes and
time; past it the scan is not complete, and a caller may claim nothing from it. A process whose
environ may not be read (EACCES/EPERM/EIO, or a read the caller's guard gave up as stuck) is
counted unreadable: never "carries nothing".

A scan for trees whose roots started at or after some tick (`born_since`) does not read the
environ of a process that started earlier, and takes it as carrying nothing. A descendant is born
after its root, so an older process is never of the tree: it could carry the token only by being
handed it (then re-exec'ing with it, or writing it into its memory), and a process a tree recruits
that way could as well drop the token. That is outside what the token proves either way (docs/
design.md §2: the tree is the root's descendants), and on a full node it was most of a proof's
cost: a takeover among 1,000 live owners read 1,000 environs twice. Given `ages`
(proc/ages.py), such a scan takes the age of a process it has read before, still alive, from
there instead of its stat: every listed process is still accounted for, by a stat read now or one
read before from the very same process.

A zombie settles a pass only when seen unchanged in the pass before, since it may have been alive
after the listing. A zombie the caller proved dead before the scan began (`dead`: a root whose exit
its pidfd reported) cannot have been, so it settles at once when it is that very process: the same
start ticks and the same pidfs inode, never by start ticks alone (a pid reused within a tick looks
the same). A tree proof right after its root's death otherwise listed /proc twice, the root still
a zombie awaiting its parent.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from holdfast.proc import listing_rules
from holdfast.proc.ages import ProcessAges
from holdfast.proc.environ import EnvironReader, plain_environ, read_proc_file, value_in_block
from holdfast.proc.procstat import ProcStat, StatParseError, parse_stat

# A pass settles only if no listed process exits between the listing and its read, and none is
# caught in the middle of an execve, so on a host with steady churn each pass settles by chance
# (measured beside a shell loop of /bin/true, 126-150 processes: 31 and 48 of 100 scans settled
# within 8 passes; with mid-execve processes never settling, 91-93 of 100 within 64 and 100 of 100
# within 256, mean 21-29 passes, 33-42 ms). More passes grant nothing a pass would not: each is
# judged alone. The time bound caps a large host's cost.
MAX_PASSES = 256
MAX_SECONDS = 1.0
MOUNT_TABLE_READS = 3  # listing_hidden's reads of a mount table that named no mount of /proc's device
# Start ticks are whole clock ticks and boot time is read once per pass: allow for rounding.
_TICK_SLACK = 2
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Carrier:
    pid: int
    ppid: int
    token: bytes
    root: bool


@dataclass
class Scan:
    enumerable: bool  # the listing holds every process (see `hidden`)
    stable: bool = False  # the last pass was settled: every listed pid accounted for
    passes: int = 0
    scanned: int = 0
    listed: int = 0  # entries of `proc` the last pass listed
    older: int = 0  # started before `born_since`: environ not read
    unreadable: int = 0
    carriers: list[Carrier] = field(default_factory=list)
    # Start ticks of each unreadable process, None where its stat could not be read either.
    unreadable_started: list[int | None] = field(default_factory=list)
    init_unreadable: bool = False  # pid 1 of the namespace read is among the unreadable
    hidden: str = ""  # why the listing may leave live processes out; "" when it leaves none out

    @property
    def complete(self) -> bool:
        return self.enumerable and self.stable and self.unreadable == 0

    def unreadable_since(self, root_start_ticks: int) -> int:
        """Unreadable processes that could belong to a tree whose root started at these ticks.

        A descendant is born after its root, so an unreadable process that started strictly
        earlier cannot be one (a pid namespace's init, unreadable inside many containers, would
        otherwise make every tree unprovable). One started in the same tick, or with no readable
        stat, still counts: it could be a member. Ticks 0 (no root) counts everything.
        """
        if root_start_ticks <= 0:
            return self.unreadable
        return sum(1 for ticks in self.unreadable_started if ticks is None or ticks >= root_start_ticks)

    def of_token(self, token: bytes) -> list[Carrier]:
        return [c for c in self.carriers if c.token == token]


# What a pass read of one pid: its start ticks and the value it carried (None: none, or a zombie).
_Seen = dict[int, tuple[int, bytes | None]]
# Read alive with an empty environ: contents unknown, never "carries nothing". A NUL cannot stand
# in an environ value, so this is no process's value.
EMPTY = b"\0empty"


def _boot_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK)


# The tokens a scan looks for; None: every value of the variable.
Wanted = frozenset[bytes] | None
# Processes proven dead before a scan began: pid -> (start ticks, pidfs inode).
Dead = Mapping[int, tuple[int, int]]


def _settled(before: _Seen, pid: int, start_ticks: int, wanted: Wanted) -> bool:
    """A pid not read alive in this pass is accounted for only when the pass before read the same
    process (same start ticks) carrying nothing this scan looks for: then nothing it forked since
    carries it either (a descendant that rewrites its environ is the cgroup's to find)."""
    if pid not in before:
        return False
    ticks, value = before[pid]
    known = value != EMPTY
    return ticks == start_ticks and known and (value is None or (wanted is not None and value not in wanted))


def _dead_before_listing(pid: int, start_ticks: int, dead: Dead) -> bool:
    """Whether this zombie is a process proven dead before the scan began: its pidfd (opened now,
    a zombie still has one) has the recorded pidfs inode. Without one (0), nothing is proven."""
    ticks, inode = dead.get(pid, (0, 0))
    if not inode or ticks != start_ticks:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        return os.fstat(fd).st_ino == inode
    finally:
        os.close(fd)


def last_pid(proc: str, device: int) -> int | None:
    """The pid most recently handed out in the reader's pid namespace (the last field of
    /proc/loadavg, on every kernel; ns_last_pid needs CONFIG_CHECKPOINT_RESTORE); None when
    unreadable, or when the file read is not on `device`, the st_dev of the `proc` listed: a file
    mounted over it (LXCFS's loadavg: another namespace's counter, or a cached value) would hide a
    wrap, and a procfs's own file is on its device (whether `proc` is a procfs is `listing_hidden`'s)."""
    try:
        fd = os.open(f"{proc}/loadavg", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_dev != device:
            return None
        return int(os.read(fd, 4096).split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def pids_ascended(before: int | None, after: int | None) -> bool:
    """Whether the pids handed out between two readings of `last_pid` only went up. A listing of
    /proc walks pids upwards and is no snapshot: a process born during it is listed if its pid lies
    ahead of the walk, which the pid counter guarantees until it wraps. After a wrap a child can be
    born behind the walk to a parent that then exits ahead of it, and neither is listed, with
    nothing "listed then gone" to unsettle the pass (a fork-hopping carrier in a namespace with a
    small pid_max was declared gone that way in 17 of 3,335 scans). A counter that could not be read
    proves nothing either way, so it is taken as a wrap."""
    return before is not None and after is not None and after >= before


def listing_hidden(proc: str) -> str:
    """Why a listing of `proc` may leave out processes this process may not see, or what a scan
    reads under it may not be the procfs's own (`listing_rules.hidden`, over this mount namespace's
    mounts); "" when neither. Read at every scan: a remount or a mount takes effect at the next one."""
    groups = {os.getegid(), *os.getgroups()}
    listed = os.path.realpath(proc)  # as mountinfo names it: a mount over what is read under it counts
    why = ""
    # A mount table read while mounts come and go (simulated hosts starting and ending beside it) was
    # seen, now and then, to name no mount of the listed /proc's device, and every tree proof of that
    # scan waited (OWNERSHIP_UNKNOWN): that answer alone is asked again before it stands.
    for _ in range(MOUNT_TABLE_READS):
        try:
            device = os.stat(proc).st_dev
            mountinfo = read_proc_file("/proc/self/mountinfo").decode(errors="replace")
        except OSError as exc:
            return f"cannot tell whether {proc} hides processes: {exc.strerror}"
        why = listing_rules.hidden(mountinfo, (os.major(device), os.minor(device)), groups, listed)
        if not listing_rules.unlisted(why):
            return why
    return why


def _has_unlisted_child(proc: str, entry: str, listed: set[str]) -> bool:
    """Whether the process has a child this pass's listing does not hold (forked since)."""
    try:
        tasks = os.listdir(f"{proc}/{entry}/task")
        kids = [k for t in tasks for k in read_proc_file(f"{proc}/{entry}/task/{t}/children").split()]
    except OSError:
        return True  # cannot tell: not settled
    return any(k.decode() not in listed for k in kids)


def _stat_of(proc: str, entry: str, ages: ProcessAges | None) -> ProcStat:
    """The process's stat, its age then kept in `ages` under a pidfd opened before the read."""
    if ages is None:
        return parse_stat(read_proc_file(f"{proc}/{entry}/stat"))
    pidfd = ages.opened(int(entry))
    try:
        stat = parse_stat(read_proc_file(f"{proc}/{entry}/stat"))
    except BaseException:
        if pidfd is not None:
            ages.forget(pidfd)
        raise
    if pidfd is not None:
        ages.learn(int(entry), pidfd, stat.start_ticks)
    return stat


def _one_pass(variable: bytes, wanted: Wanted, proc: str, entries: list[str], listed_at: int,
              before: _Seen, born_since: int, ages: ProcessAges | None,
              known: dict[int, int], dead: Dead, environ: EnvironReader) -> tuple[Scan, _Seen]:
    """One pass over the listed `entries`; `known` is `ages.alive()` as of after the listing."""
    result = Scan(enumerable=True)
    listed = set(entries)
    seen: _Seen = {}
    unsettled = 0
    found: dict[int, tuple[int, bytes]] = {}  # pid -> (ppid, value)
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if known.get(pid, born_since) < born_since:
            seen[pid] = (known[pid], None)  # older than every root looked for, alive since read
            result.older += 1
            continue
        try:
            stat = _stat_of(proc, entry, ages)
        except FileNotFoundError:
            unsettled += 1  # listed, gone before it was read: it may have forked after the listing
            continue
        except ProcessLookupError:
            unsettled += 1
            continue
        except (OSError, StatParseError):
            result.scanned += 1
            result.unreadable += 1
            result.unreadable_started.append(None)
            result.init_unreadable |= pid == 1
            continue
        if stat.start_ticks > listed_at + _TICK_SLACK:
            # Born after the listing: the listed process is gone and its pid taken by another.
            unsettled += 1
            continue
        if stat.start_ticks < born_since:
            seen[pid] = (stat.start_ticks, None)  # older than every root looked for: see above
            result.older += 1
            continue
        try:
            block = environ(entry, stat.start_ticks, proc)
        except (FileNotFoundError, ProcessLookupError):
            unsettled += not _settled(before, pid, stat.start_ticks, wanted)
            continue
        except OSError:
            # EACCES/EPERM/EIO, or stuck: alive but unreadable; absence claims are off for this scan.
            result.scanned += 1
            result.unreadable += 1
            result.unreadable_started.append(stat.start_ticks)
            result.init_unreadable |= pid == 1
            continue
        if block is None and stat.kernel_thread:
            continue  # a kernel thread: no environ, never a carrier, never a tree's
        if block is None:
            # A zombie: nothing of it runs now, but if it was alive after the listing it may have
            # forked a child the listing missed. Settled once seen unchanged (then it was dead
            # before this pass's listing, and forked nothing since), or proven dead before the scan.
            seen[pid] = (stat.start_ticks, None)
            unsettled += not (_settled(before, pid, stat.start_ticks, wanted)
                              or _dead_before_listing(pid, stat.start_ticks, dead))
            continue
        if not block and not stat.kernel_thread and not stat.started_without_environ:
            # An empty environ of a live user process that was not started with an empty one. A
            # carrier reads as none then, so what it carries is unknown: it never vouches for a
            # later pass (EMPTY is not "carries nothing").
            seen[pid] = (stat.start_ticks, EMPTY)
            if not stat.env_start:
                # No environ laid out: in the middle of an execve (the new program's environ is
                # not written yet) or exiting. Both pass by themselves, and the first may end in a
                # carrier, so such a process never settles a pass, however often it is seen: two
                # passes over a small namespace fit inside one slow execve (seen under load: the
                # gate being attested was missed, "0 tree roots carry the token").
                unsettled += 1
                continue
            # Laid out yet unreadable as empty (its memory unmapped): settled only when seen so
            # before as well, with no child the listing missed.
            unchanged = before.get(pid) == (stat.start_ticks, EMPTY)
            unsettled += not unchanged or _has_unlisted_child(proc, entry, listed)
            continue
        result.scanned += 1
        value = value_in_block(block, variable)
        seen[pid] = (stat.start_ticks, value)
        if value is not None and (wanted is None or value in wanted):
            found[pid] = (stat.ppid, value)
    values = {pid: value for pid, (_, value) in found.items()}
    result.carriers = [Carrier(pid, ppid, value, root=values.get(ppid) != value)
                       for pid, (ppid, value) in found.items()]
    result.stable = unsettled == 0
    return result, seen


def scan(variable: bytes, token: bytes | frozenset[bytes] | None = None, proc: str = "/proc",
         max_passes: int = MAX_PASSES, max_seconds: float = MAX_SECONDS, born_since: int = 0,
         ages: ProcessAges | None = None, dead: Dead | None = None,
         environ: EnvironReader = plain_environ) -> Scan:
    """Carriers of `variable` (only those whose value is `token`, or one of a set, when given),
    roots marked, from the first settled pass; or the last pass, not stable, when none settled
    within the bounds. Naming the tokens wanted lets another session's churn settle a pass;
    `born_since` (the earliest start ticks of the roots whose tokens are wanted; 0: none known)
    spares the environ reads of every older process, and with `ages` (of this process's own pid
    namespace, whose /proc `proc` must be) the stat reads of those read before; a zombie in `dead`
    (same namespace) settles the first pass it is seen in. Every environ is read through `environ`."""
    found = passes(variable, token, proc, max_passes, max_seconds, born_since, ages, dead, environ)
    return collections.deque(found, maxlen=1)[0]  # the last one yielded is the result


def passes(variable: bytes, token: bytes | frozenset[bytes] | None = None, proc: str = "/proc",
           max_passes: int = MAX_PASSES, max_seconds: float = MAX_SECONDS, born_since: int = 0,
           ages: ProcessAges | None = None, dead: Dead | None = None,
           environ: EnvironReader = plain_environ) -> Iterator[Scan]:
    """The passes of `scan`, in turn: the last one yielded is its result (a settled one ends them)."""
    wanted: Wanted = frozenset((token,)) if isinstance(token, bytes) else token
    deadline = time.monotonic() + max_seconds
    before: _Seen = {}
    count = 0
    hidden = listing_hidden(proc)
    while True:
        listed_at = _boot_ticks()
        try:
            device = os.stat(proc).st_dev
            first = last_pid(proc, device)
            entries = os.listdir(proc)
        except OSError:
            yield Scan(enumerable=False, passes=count)
            return
        wrapped = not pids_ascended(first, last_pid(proc, device))
        count += 1
        known = ages.alive() if ages is not None and born_since > 0 else {}  # after the listing
        result, before = _one_pass(variable, wanted, proc, entries, listed_at, before, born_since,
                                   ages, known, dead or {}, environ)
        result.stable = result.stable and not wrapped
        result.passes, result.listed = count, len(entries)
        result.enumerable, result.hidden = not hidden, hidden
        yield result
        if result.stable or count >= max_passes or time.monotonic() >= deadline:
            return

