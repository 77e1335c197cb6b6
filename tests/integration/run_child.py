"""The child that `holdfast run` runs in the session tests: the overlap detector of docs/design.md §8.

It takes an exclusive, non-blocking flock on the session's lock file (descendants inherit it) and
logs `overlap` if it cannot — two trees at once; then logs `start` and `resumes` (the provider handle
and chain it was handed: `resumes … HANDLE CHAIN`), optionally records a provider
handle and forks a grandchild that holds the lock too and ends slowly on SIGTERM. On SIGTERM it
logs `stop` and exits 0. Log lines: `<event> <fence> <host> <pid> <time_ns>`.

usage: run_child.py LOCK LOG [--handle H] [--grandchild]
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time


def log(path: str, event: str, *details: str) -> None:
    line = " ".join([event, os.environ.get("HOLDFAST_FENCE", "-"), os.environ.get("HOLDFAST_HOST_ID", "-"),
                     str(os.getpid()), str(time.time_ns()), *details]) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines from several processes never mix
    finally:
        os.close(fd)


def main() -> int:
    lock_path, log_path, *rest = sys.argv[1:]
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    os.set_inheritable(lock, True)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(log_path, "overlap")
        return 3
    signal.signal(signal.SIGTERM, lambda *_: (log(log_path, "stop"), os._exit(0)))
    if "--grandchild" in rest:
        # Holds the lock through the inherited fd; on SIGTERM it takes 0.3 s before it exits.
        subprocess.Popen([sys.executable, "-c", GRANDCHILD, log_path], pass_fds=(lock,))
    log(log_path, "start")
    # What it would resume: the newest handle from its environment, the chain from its grant file.
    with open(os.environ["HOLDFAST_GRANT_FILE"]) as f:
        chain = json.load(f)["resume"]["provider_handle_chain"]
    log(log_path, "resumes", os.environ["HOLDFAST_PROVIDER_HANDLE"] or "-",
        ",".join(f"{link['handle']}@{link['minted_at_fence']}" for link in chain) or "-")
    if "--handle" in rest:
        handle = rest[rest.index("--handle") + 1]
        subprocess.run([sys.executable, "-m", "holdfast.cli", "handle", handle], check=True,
                       stdout=subprocess.DEVNULL)
    while True:
        signal.pause()


GRANDCHILD = """
import os, signal, sys, time
sys.path.insert(0, os.path.dirname(os.environ["HOLDFAST_RUN_CHILD"]))
from run_child import log
def stop(*_):
    time.sleep(0.3)
    log(sys.argv[1], "grandchild-stop")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
log(sys.argv[1], "grandchild-start")
while True:
    signal.pause()
"""

if __name__ == "__main__":
    sys.exit(main())
