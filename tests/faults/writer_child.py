"""The workload's CMD: the flock overlap detector of docs/design.md §8 plus an append-only fenced writer.

It takes an exclusive, non-blocking flock on its session's lock file (descendants inherit it) and
logs `overlap` if it cannot — two trees of one session at once. Then, until it is ended, it appends
(session, fence, host, pid, seq) under its own key `w/<fence>/<host>/<pid>/<seq>` through FencedPut
with its grant, logging `send` before each call and `ack` or `refused` after it, so the checker
can hold holdfast to every acknowledgement. Log lines (one O_APPEND write each, never mixed):
`<event> <session> <fence> <host> <pid> <seq> <time_ns>`.

With `--hostile KIND` the tree is one a hostile user would run, and every process of it holds
the lock (the fd is inherited), so a part holdfast failed to end shows as the next tree's
`overlap`: `hopper` (a branch that forks its successor and exits, over and over), `dropper` (a
child without the spawn token), `setsid` (a double fork into a new session), `ignore-term` (the
writer itself ignores SIGTERM). Every hostile part ignores SIGTERM.

usage: writer_child.py LOCK LOG [--unfenced] [--hostile KIND]   (--unfenced: started outside
`holdfast run`, the harness's deliberately broken client that skips the gate; it only takes the
lock and logs)
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import time

from holdfast.client.connection import Client
from holdfast.client.errors import ClientError
from holdfast.client.grant import Grant

WRITE_EVERY_S = 0.15
HOSTILE = ("hopper", "dropper", "setsid", "ignore-term")
_HOP = 'trap "" TERM; sleep 0.2; sh -c "$HOP" & exit 0'
_IDLE = 'trap "" TERM; while :; do sleep 1; done'


def log(path: str, event: str, seq: int = 0) -> None:
    env = os.environ
    line = (f"{event} {env.get('HOLDFAST_SESSION', '-')} {env.get('HOLDFAST_FENCE', '0')} "
            f"{env.get('HOLDFAST_HOST_ID', '-')} {os.getpid()} {seq} {time.time_ns()}\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def write_forever(log_path: str) -> None:
    grant = Grant.from_file(os.environ["HOLDFAST_GRANT_FILE"])
    host = os.environ.get("HOLDFAST_HOST_ID", "-")
    async with Client(grant.coordinator) as client:
        for seq in range(1, 1_000_000):
            key = f"w/{grant.fence}/{host}/{os.getpid()}/{seq}"
            log(log_path, "send", seq)
            try:
                await client.fenced_put(grant, key, f"{grant.session_id} {grant.fence} {host} {seq}".encode())
            except ClientError as err:
                log(log_path, f"refused:{err.reason}", seq)
            else:
                log(log_path, "ack", seq)
            await asyncio.sleep(WRITE_EVERY_S)


def start_hostile(kind: str, lock: int) -> None:
    """The hostile part of the tree; each process of it inherits the locked fd."""
    if kind == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return
    env = dict(os.environ)
    if kind == "hopper":
        env["HOP"] = _HOP
        argv = ["sh", "-c", 'sh -c "$HOP" &']
    elif kind == "dropper":
        env.pop(Grant.from_file(env["HOLDFAST_GRANT_FILE"]).spawn_token_env, None)
        argv = ["sh", "-c", _IDLE]
    else:
        argv = ["setsid", "sh", "-c", f"({_IDLE}) & exit 0"]
    subprocess.Popen(argv, env=env, pass_fds=(lock,), stdin=subprocess.DEVNULL)


def main() -> int:
    lock_path, log_path, *rest = sys.argv[1:]
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(log_path, "overlap")
        return 3
    signal.signal(signal.SIGTERM, lambda *_: (log(log_path, "stop"), os._exit(0)))
    log(log_path, "start")
    if "--hostile" in rest:
        start_hostile(rest[rest.index("--hostile") + 1], lock)
    if "--unfenced" in rest:
        print("started", flush=True)  # the harness waits for it: a fault may end this child only after
        sys.stdout.close()
        while True:
            signal.pause()
    asyncio.run(write_forever(log_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
