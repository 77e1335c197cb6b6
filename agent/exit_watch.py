"""Exit events from the kernel, the moment they happen: one pidfd per watched identity, polled by
the event loop. The pidfd is opened first and the identity re-checked after, closing the
read-then-open race; observed exits are remembered by full identity, never by pid. Arming may read
the owner's environ, through the reader it is given (agent/reads.py); the watch itself is the loop's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from holdfast.agent.observe import pidfd_exited
from holdfast.proc.environ import EnvironReader
from holdfast.v1 import agent_pb2

P = agent_pb2.ProbeOutcome
# What `arm` found: the pidfd of a live owner, and the verdict of its probe.
Armed = tuple[int | None, agent_pb2.ProbeResult]
# Forgetting an old exit is safe (the /proc evidence remains); the cap only bounds memory.
MEMORY_CAP = 65536


def identity_key(identity: agent_pb2.ProcessIdentity) -> bytes:
    return identity.SerializeToString(deterministic=True)


def exit_result() -> agent_pb2.ProbeResult:
    return agent_pb2.ProbeResult(outcome=P.EXIT_OBSERVED, reason="pidfd reported the exit",
                                 observed_at_unix_ms=int(time.time() * 1000))


class ExitWatcher:
    """Pidfds for watched owners; `probe` judges an identity from /proc without this memory."""

    def __init__(self, probe: Callable[[agent_pb2.ProcessIdentity, EnvironReader], agent_pb2.ProbeResult],
                 ) -> None:
        self._probe = probe
        self._exited: dict[bytes, int] = {}
        self._watches: dict[bytes, asyncio.Future[agent_pb2.ProbeResult]] = {}

    def exited(self, identity: agent_pb2.ProcessIdentity) -> bool:
        return identity_key(identity) in self._exited

    def _remember(self, key: bytes) -> None:
        self._exited[key] = int(time.time() * 1000)
        while len(self._exited) > MEMORY_CAP:
            self._exited.pop(next(iter(self._exited)))

    def known(self, identity: agent_pb2.ProcessIdentity) -> asyncio.Future[agent_pb2.ProbeResult] | None:
        """The watch held for this identity, or one resolved at once when its exit is remembered;
        None: it is to be armed (`arm`) and then watched (`watch`). On the loop."""
        key = identity_key(identity)
        if key in self._watches:
            return self._watches[key]
        if key in self._exited:
            done: asyncio.Future[agent_pb2.ProbeResult] = asyncio.get_running_loop().create_future()
            done.set_result(exit_result())
            return done
        return None

    def arm(self, identity: agent_pb2.ProcessIdentity, environ: EnvironReader) -> Armed:
        """A pidfd opened, then the identity judged from /proc, its environ (where it decides) read
        through `environ`: (the pidfd, IDENTITY_MATCHED) when it names this owner, else (None, what
        proves it is not)."""
        try:
            fd = os.pidfd_open(identity.pid)
        except OSError:
            return None, self._probe(identity, environ)
        try:
            now = self._probe(identity, environ)
        except BaseException:  # to start over as a job, or given up while stuck on a read
            os.close(fd)
            raise
        same_fd = not identity.pidfd_ino or os.fstat(fd).st_ino == identity.pidfd_ino
        if now.outcome != P.IDENTITY_MATCHED or not same_fd:
            # Not this owner at this pid (or it died between open and re-check): the probe says which.
            os.close(fd)
            return None, now if now.outcome != P.IDENTITY_MATCHED else self._probe(identity, environ)
        return fd, now

    def watch(self, identity: agent_pb2.ProcessIdentity,
              armed: Armed) -> asyncio.Future[agent_pb2.ProbeResult]:
        """Resolves with EXIT_OBSERVED on exit, or at once with whatever `arm` found proving it is not
        this owner. Takes the pidfd `arm` opened; a watch armed meanwhile by another call is shared."""
        fd, now = armed
        already = self.known(identity)
        if already is not None:
            if fd is not None:
                os.close(fd)
            return already
        loop = asyncio.get_running_loop()
        key = identity_key(identity)
        done: asyncio.Future[agent_pb2.ProbeResult] = loop.create_future()
        if fd is None:
            done.set_result(now)
            return done
        if pidfd_exited(fd):
            os.close(fd)
            self._remember(key)
            done.set_result(exit_result())
            return done

        def on_exit() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self._watches.pop(key, None)
            self._remember(key)
            if not done.done():
                done.set_result(exit_result())

        loop.add_reader(fd, on_exit)
        self._watches[key] = done
        return done
