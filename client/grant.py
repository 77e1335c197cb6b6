"""A grant as its owner holds it: the fence and secret every owner write carries, and the cluster
that minted it.

Guarantee: the secret is never printed (not in repr, not in logs); the grant file is mode 0600 and
created exclusively, in a directory held open, never through a link, and read through no link
another user made or may swap (`from_file`); a grant answered by another holdfast cluster is
refused (WRONG_CLUSTER) before anything is done with the answer.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from holdfast.client.errors import ClientError
from holdfast.common import files
from holdfast.common.reasons import Reason

GRANT_FILE = "grant.json"


@dataclass(frozen=True)
class Grant:
    """A grant: the fence and secret every owner write carries. The secret is never printed."""

    session_id: str
    fence: int
    secret: str = field(repr=False)
    spawn_token: str = field(repr=False)
    spawn_token_env: str
    coordinator: str
    # The holdfast cluster that minted it ('' from an older coordinator; grant files written before
    # the field existed read back as ''): sent with every write, checked in every answer.
    cluster_id: str = ""
    # The etcd revision the grant wrote its record at (0: unknown, a replayed answer): the owner's
    # watch asks only for the changes after it instead of listing the record again.
    revision: int = 0

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Grant:
        """The grant in a grant file; what else the file carries (`resume`) is not the grant's.
        Raises ValueError unless the file is a regular file of this user's alone, as `run` writes
        it: where another user may rename in the temp directory, they can put a directory of theirs
        where the grant directory was, and the grant in it would send CMD's writes, data and all, to
        the coordinator it names. Its directory is reached as any a user names (files.open_user_dir:
        a link on the way followed only when this user or root made it where no other user may
        swap it) and the file opened in it O_NOFOLLOW: another user's link, at the file or on the
        way, would otherwise lead CMD to another run's grant — this user's own, 0600, accepted.
        Opened without waiting: a FIFO put there is refused, not read. The directory must be this
        user's alone too, and the file have no other name: another user's directory put on the
        way, holding a hard link to another run's grant file (where links to others' files are not
        protected), would pass every other check."""
        directory, _ = files.open_user_dir(os.path.dirname(os.fspath(path)) or ".")
        try:
            held = os.fstat(directory)
            fd = os.open(os.path.basename(os.fspath(path)), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=directory)
        finally:
            os.close(directory)
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(fd)
            me = os.geteuid()
            if held.st_uid != me or held.st_mode & 0o022:
                raise ValueError(f"{os.fspath(path)} is not in a directory of this user's alone (owner uid "
                                 f"{held.st_uid}, mode {stat.S_IMODE(held.st_mode):o}; `run` makes it 0700)")
            if not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_mode & 0o077 or st.st_nlink != 1:
                raise ValueError(f"{os.fspath(path)} is not a grant file of this user's alone (owner uid "
                                 f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}, {st.st_nlink} names; "
                                 "`run` writes it 0600, once)")
            found = json.loads(file.read())
        return cls(**{f.name: found[f.name] for f in fields(cls) if f.name in found})

    def write(self, directory: int, resume: Mapping[str, object] | None = None) -> None:
        """GRANT_FILE, mode 0600, in the directory open as `directory`: what the child reads to make
        fenced writes, and with `resume` what it needs to resume the provider's session
        (`holdfast.client.owner.resume_of`). Created through the descriptor, exclusively and not
        through a link: never where a path swapped meanwhile would lead."""
        fd = os.open(GRANT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=directory)
        with os.fdopen(fd, "w") as f:
            json.dump({**asdict(self), **({"resume": dict(resume)} if resume is not None else {})}, f)


def same_cluster(grant: Grant, answered_by: str) -> None:
    """Every answer of one run must come from the cluster that minted its grant: another one means
    two holdfast clusters answer one address (two `holdfast up` on one port). '' is an older
    coordinator's answer."""
    if grant.cluster_id and answered_by and answered_by != grant.cluster_id:
        raise ClientError(Reason.WRONG_CLUSTER, f"the coordinator at {grant.coordinator} answered for "
                          f"holdfast cluster {answered_by[:64]!r}, but fence {grant.fence} was granted by "
                          f"cluster {grant.cluster_id!r}", grant.session_id)
