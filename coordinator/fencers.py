"""Running a fence agent (the `fence_*` programs of ClusterLabs' fence-agents, or anything speaking
their stdin protocol) for one host: `off`, then `status`.

Guarantee: the program runs in a process group of its own and is given the fence timeout per
action; at the timeout the whole group is SIGKILLed, and whatever is left of the group when an
action ends is killed too, so nothing of an attempt outlives it while the coordinator runs (one
killed mid-attempt leaves the agent to end by its own timeouts); an action ends by its timeout even
when a helper that left the group still holds its output, and at most OUTPUT_READ bytes of each
stream are kept, so no agent can fill the coordinator's memory. Options go on standard input as
`name=value` lines, never on the command line (where `ps` shows them); secrets are read from their
files for each attempt, are never logged and are masked in every output recorded
(holdfast.coordinator.fence_rules judges the proof; this module only runs and records).

The out-of-service taint fencer makes one read of the host's Node (a blocking client call, on a
worker thread, given the fence timeout) and records what it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from holdfast.coordinator import fence_rules
from holdfast.coordinator.fence_rules import Answer, FencerSpec
from holdfast.v1 import coordinator_pb2 as pb

OFF, STATUS = "off", "status"
OUTPUT_READ = 1 << 16  # bytes of each stream read and judged; more on stdout is no answer
KILLED_WITHIN_S = 5.0  # a SIGKILLed agent is gone by then unless the kernel holds it


class NodeReader(Protocol):
    """A Node read from the API server, as the JSON it sends (None: 404)."""

    def read_node(self, name: str) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


NodeReaders = Callable[[FencerSpec], NodeReader]  # one reader per attempt, from the fencer's options


@dataclass(frozen=True)
class Lost:
    """What a fence of a host may rest on besides its fencer: the Node uid its registered-last
    registration carried, and what this replica's reads of that Node found since it saw that
    registration absent (each read adds to them)."""

    node_uid: str = ""
    sightings: fence_rules.TaintSightings = field(default_factory=fence_rules.TaintSightings)


def check_fencers(specs: Iterable[FencerSpec]) -> None:
    """At start: every program is an executable file and every secret file is readable, so a typo is
    a clear error before serving rather than an `unknown` at the first lost host; and the file the
    path resolves to is not an agent that proves nothing (a link of another name to fence_dummy)."""
    for spec in specs:
        if spec.kind == fence_rules.KUBERNETES:
            continue  # no program: its API server is checked when its reader is made
        program = Path(spec.program)
        why = fence_rules.proves_nothing(os.path.realpath(program))
        if why:
            raise ValueError(f"setting fencers: program {spec.program} (hosts {spec.hosts!r}) resolves "
                             f"to {why}")
        if not program.is_file() or not os.access(program, os.X_OK):
            raise ValueError(f"setting fencers: program {spec.program} (hosts {spec.hosts!r}) is not an "
                             "executable file (install fence-agents, or fix the path)")
        for name, path in spec.secrets:
            if not os.access(path, os.R_OK) or not Path(path).is_file():
                raise ValueError(f"setting fencers: secret file {path} of option {name!r} (hosts "
                                 f"{spec.hosts!r}) is not a readable file")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _Output(asyncio.SubprocessProtocol):
    """What an agent prints: each stream's first OUTPUT_READ bytes. The rest is read and dropped, so a
    chatty agent can neither fill the coordinator's memory nor stall on a pipe no one reads (then its
    end is never seen)."""

    def __init__(self, ended: asyncio.Future[None], exited: asyncio.Future[None]) -> None:
        self.kept = {1: bytearray(), 2: bytearray()}
        self.overflowed = {1: False, 2: False}
        self.ended, self.exited = ended, exited

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.kept[fd]
        room = OUTPUT_READ - len(kept)
        kept += data[:room]
        self.overflowed[fd] |= len(data) > room

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:  # exited, and every pipe at its end
        if not self.ended.done():
            self.ended.set_result(None)


async def run_action(program: str, action: str, options: list[tuple[str, str]],
                     timeout: float) -> pb.FenceAction:
    """One run of the agent: options on stdin, in its own process group, killed whole at `timeout`.
    The output is as printed (secrets in it unmasked): fence() judges it, then masks it."""
    started = time.monotonic()
    result = pb.FenceAction(action=action)
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    exited: asyncio.Future[None] = loop.create_future()
    try:
        transport, output = await loop.subprocess_exec(
            lambda: _Output(ended, exited), program, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        result.error = f"{exc.strerror or exc} ({program})"
        return result
    result.ran = True
    try:
        stdin = transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        stdin.write(fence_rules.stdin_text(action, options).encode())
        stdin.close()
        await asyncio.wait_for(ended, timeout)
        returncode = transport.get_returncode()
        result.exit_code = returncode if returncode is not None else -1
    except TimeoutError:
        result.timed_out = True
    finally:
        # The group, not the pid: an agent's helpers (ipmitool, ssh, curl) die with it. Closing the
        # pipes then waits for no helper that left the group (setsid) and still holds them.
        _kill_group(transport.get_pid())
        transport.close()
        # Reaped before the attempt goes on; bounded, so one stuck in the kernel stalls no loop.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), KILLED_WITHIN_S)
    if output.overflowed[1]:
        result.error = f"printed more than {OUTPUT_READ} bytes on stdout: not an answer"
    result.stdout = output.kept[1].decode(errors="replace")
    result.stderr = output.kept[2].decode(errors="replace")
    result.took_ms = int((time.monotonic() - started) * 1000)
    return result


def read_secrets(spec: FencerSpec) -> dict[str, str]:
    """Each secret option's value from its file, read now (a rotated secret is used at once)."""
    return {name: fence_rules.secret_of(Path(path).read_text()) for name, path in spec.secrets}


async def read_node(spec: FencerSpec, host_id: str, timeout: float,
                    readers: NodeReaders) -> dict[str, Any] | None:
    """Node `host_id` (an enrolled agent's host id is its Node's name) as the API server answers
    now (None: 404), read on a worker thread within `timeout`; raises on any failure to read."""
    reader = readers(spec)
    try:
        return await asyncio.wait_for(asyncio.to_thread(reader.read_node, host_id), timeout)
    finally:
        reader.close()


async def read_taint(spec: FencerSpec, host_id: str, timeout: float, lost: Lost,
                     readers: NodeReaders | None) -> tuple[list[pb.FenceAction], Answer, str]:
    """One read of Node `host_id`, judged against the reads before it, then added to them."""
    started = time.monotonic()
    action = pb.FenceAction(action=fence_rules.READ_NODE)
    node: dict[str, Any] | None = None
    if lost.node_uid:  # else nothing is asked: the rules say why not
        if readers is None:
            action.error = "no Kubernetes API client was configured"
            return [action], Answer.UNKNOWN, action.error
        try:
            node = await read_node(spec, host_id, timeout, readers)
        except Exception as exc:  # the API server's trouble is an unknown, never a proof
            action.error = f"the API server did not answer: {type(exc).__name__}: {str(exc)[:300]}"
            action.took_ms = int((time.monotonic() - started) * 1000)
            return [action], Answer.UNKNOWN, action.error
    answer, detail, seen = fence_rules.judge_taint(node, host_id, lost.node_uid, lost.sightings)
    if lost.node_uid:
        lost.sightings.saw(node)
    action.ran, action.stdout = True, seen
    action.took_ms = int((time.monotonic() - started) * 1000)
    return [action], answer, detail


async def fence(spec: FencerSpec, host_id: str, timeout: float, lost: Lost | None = None,
                readers: NodeReaders | None = None) -> tuple[list[pb.FenceAction], Answer, str]:
    """`off`, then (only after an off that may prove) `status`; the actions as recorded and the answer.
    The taint fencer reads the Node instead."""
    if spec.kind == fence_rules.KUBERNETES:
        return await read_taint(spec, host_id, timeout, lost or Lost(), readers)
    try:
        secret_values = read_secrets(spec)
        options = fence_rules.agent_options(spec, host_id, secret_values)
    except (OSError, ValueError) as exc:
        # The file's name is in the message, never its content.
        off = pb.FenceAction(action=OFF, error=f"secret unreadable: {exc}")
        return [off], *fence_rules.judge(off, None)
    off = await run_action(spec.program, OFF, options, timeout)
    actions = [off]
    if fence_rules.needs_status(off):
        actions.append(await run_action(spec.program, STATUS, options, timeout))
    # Judged on all it printed as it printed it: a secret or the excerpt's end hides no line.
    answer, why = fence_rules.judge(off, actions[1] if len(actions) > 1 else None)
    for action in actions:
        action.stdout = fence_rules.mask(action.stdout, secret_values.values())
        action.stderr = fence_rules.mask(action.stderr, secret_values.values())
    return actions, answer, why
