"""A FUSE filesystem, served straight on /dev/fuse, whose daemon never answers a READ, and a process
that maps a file of it over its own environ: reading that process's /proc/PID/environ then waits in
the kernel until the daemon answers, which it never does (an unprivileged user can do this with
any FUSE filesystem of its own). The layouts are linux/fuse.h's; no FUSE library is needed.

Teardown closes the daemon's /dev/fuse descriptor, which aborts the connection, so every read
waiting on it returns (an error), then detaches the mount.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import stat
import struct
import threading
from pathlib import Path
from types import TracebackType

FILE = "stuck"
FILE_SIZE = 1 << 20
_ROOT, _NODE = 1, 2
_LOOKUP, _FORGET, _GETATTR, _OPEN, _READ, _INIT, _INTERRUPT, _BATCH_FORGET = 1, 2, 3, 14, 15, 26, 36, 42
_NO_REPLY = (_FORGET, _INTERRUPT, _BATCH_FORGET)
_IN_HEADER = struct.Struct("<IIQQIIIHH")  # fuse_in_header
_OUT_HEADER = struct.Struct("<IiQ")  # fuse_out_header
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_BUFFER = FILE_SIZE + 65536  # above max_write + headers, and FUSE_MIN_READ_BUFFER
_VALID_S = 3600
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2

_libc = ctypes.CDLL(None, use_errno=True)


def _attr(node: int) -> bytes:
    mode = (stat.S_IFDIR | 0o755) if node == _ROOT else (stat.S_IFREG | 0o444)
    size = 0 if node == _ROOT else FILE_SIZE
    return _ATTR.pack(node, size, size // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


class StuckFuse:
    """Mounted at `mountpoint` while entered; `read_asked` is set once the daemon got a READ. With
    `allow_other`, users other than root may use it too."""

    def __init__(self, mountpoint: Path, allow_other: bool = False) -> None:
        self.mountpoint = mountpoint
        self.allow_other = allow_other
        self.file = mountpoint / FILE
        self.read_asked = threading.Event()
        self._fd = -1
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._serve, name="stuck-fuse", daemon=True)

    def __enter__(self) -> StuckFuse:
        if not os.path.exists("/dev/fuse"):
            raise RuntimeError("/dev/fuse is missing: this test needs the FUSE device (modprobe fuse, or a "
                               "container started with --device /dev/fuse)")
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        options = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0"
        options += ",allow_other" if self.allow_other else ""
        if _libc.mount(b"holdfast-stuck", str(self.mountpoint).encode(), b"fuse", _MS_NOSUID | _MS_NODEV,
                       options.encode()) != 0:
            code = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(code, f"mount fuse at {self.mountpoint}: {os.strerror(code)}")
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        # The daemon's last descriptor closed aborts the connection: every read waiting on it returns.
        os.write(self._wake_w, b"x")
        self._thread.join(10)
        os.close(self._fd)
        _libc.umount2(str(self.mountpoint).encode(), _MNT_DETACH)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _reply(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        with_header = _OUT_HEADER.pack(_OUT_HEADER.size + len(body), -error, unique) + body
        try:
            os.write(self._fd, with_header)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the request was interrupted meanwhile
                raise

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            if any(fd == self._wake_r for fd, _ in poller.poll()):
                return
            try:
                request = os.read(self._fd, _BUFFER)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                    continue
                return  # ENODEV: aborted or unmounted
            _, opcode, unique, node, *_ = _IN_HEADER.unpack_from(request)
            body = request[_IN_HEADER.size:]
            if opcode == _READ:
                self.read_asked.set()  # and never answered
            elif opcode in _NO_REPLY:
                continue
            elif opcode == _INIT:
                _major, minor, readahead = struct.unpack_from("<III", body)
                self._reply(unique, body=struct.pack("<IIIIHHIIHHI7I", 7, min(minor, 38), readahead, 0,
                                                     16, 12, 65536, 1, 16, 0, 0, *[0] * 7))
            elif opcode == _LOOKUP:
                if node == _ROOT and body.rstrip(b"\0") == FILE.encode():
                    self._reply(unique, body=struct.pack("<QQQQII", _NODE, 1, _VALID_S, _VALID_S, 0, 0)
                                + _attr(_NODE))
                else:
                    self._reply(unique, errno.ENOENT)
            elif opcode == _GETATTR:
                self._reply(unique, body=struct.pack("<QII", _VALID_S, 0, 0) + _attr(node))
            elif opcode == _OPEN:
                self._reply(unique, body=struct.pack("<QII", 0, 0, 0))
            else:
                self._reply(unique, errno.ENOSYS)


# The child: maps the file, and a thread of it reads that page through /proc/self/mem. That read
# faults the page in while holding the child's mmap lock (for reading), and waits for the daemon,
# forever. Told to (`go`: the daemon got the READ), the main thread asks for the lock for writing (an
# mmap), and waits behind that reader; every later reader of the child's memory — a read of its
# environ or cmdline — queues behind it in turn. (An environ read of a file mapped over the environ
# itself does not wait: the kernel reads an environ from anonymous memory only.)
CHILD = r"""
import ctypes, mmap, os, sys, threading
path, ready, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
fd = os.open(path, os.O_RDONLY)
at = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
assert at not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
mem = os.open("/proc/self/mem", os.O_RDONLY)
threading.Thread(target=os.pread, args=(mem, 1, at), daemon=True).start()
os.write(ready, b"m")
os.read(go, 1)
libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
"""
