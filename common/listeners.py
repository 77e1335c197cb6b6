"""Who holds a TCP port: for the one-line "cannot listen" message a server prints when its port is taken.

Best effort and read-only: the listening socket's inode comes from /proc/net/tcp{,6}, its owner
from the /proc/<pid>/fd links this user may read. Anything unreadable simply leaves the holder
unnamed; this never decides anything, it only tells a person where to look.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[int]:
    """Socket inodes listening on `port` (any local address, IPv4 or IPv6)."""
    found: set[int] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[9].isdigit() and fields[9] != "0":
                found.add(int(fields[9]))
    return found


def socket_owners(inodes: set[int], proc: Path = Path("/proc")) -> list[int]:
    """Pids with an open fd on one of the socket inodes, in pid order."""
    if not inodes:
        return []
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue  # another user's process, or gone
        for fd in fds:
            try:
                if os.readlink(entry / "fd" / fd) in wanted:
                    owners.append(int(entry.name))
                    break
            except OSError:
                continue
    return sorted(owners)


def _command_line(pid: int, proc: Path) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120]


def describe_holder(port: int, proc: Path = Path("/proc")) -> str:
    """`held by pid 123 (python -m holdfast ... )`, or '' when no holder can be seen from here."""
    inodes = listening_inodes(port, proc)
    owners = socket_owners(inodes, proc)
    if owners:
        named = ", ".join(f"pid {pid}" + (f" ({cmd})" if (cmd := _command_line(pid, proc)) else "")
                          for pid in owners[:3])
        return f"held by {named}"
    if inodes:
        return "held by a process this user cannot see"
    return ""


def bind_error(listen: str) -> str:
    """Why `listen` (host:port) cannot be bound exclusively right now, '' when it can (or when it
    cannot be told without binding for real, e.g. port 0 or a name that does not resolve).

    A plain bind with SO_REUSEADDR (as gRPC's own) and without SO_REUSEPORT: it fails exactly when
    another socket listens there, not for a port left in TIME_WAIT by a previous run.
    """
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not port_text.isdigit() or int(port_text) == 0:
        return ""
    try:
        infos = socket.getaddrinfo(host or None, int(port_text), type=socket.SOCK_STREAM)
    except OSError:
        return ""
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    holder = describe_holder(int(port_text))
                    return f"address in use{', ' + holder if holder else ''}"
                return exc.strerror or str(exc)
    return ""
