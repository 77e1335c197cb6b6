"""A runtime embedding holdfast: it runs its worker as a session's single writer, writes fenced
progress, and hands the session off to a second run (a takeover) — after which the first run's late
write is refused, not lost into a store the new owner also writes.

Run it on a host whose agent is registered (`holdfast up` starts one):

    python examples/embed.py SESSION

The worker is a child process (here `sleep`, in a runtime an agent CLI such as `codex exec`):
holdfast commits a child it spawned behind its gate, never the calling process (docs/api.md).
"""

from __future__ import annotations

import sys

from holdfast.client import Run, StaleFence, session

WORKER = ["sleep", "3600"]  # stands in for the agent CLI a runtime would run


def late_write(run: Run) -> str:
    """What the first owner's write says once the session has moved past its fence."""
    try:
        run.put("progress", b"late write")
    except StaleFence as refused:
        return f"refused {refused.reason}"
    return "accepted"


def main(session_id: str) -> int:
    with session(session_id, WORKER) as first:
        revision = first.put("progress", b"step 1")
        print(f"fence {first.fence}: wrote progress at revision {revision}", flush=True)
        # The takeover asks the first run to let go: its worker's tree is ended, proven gone, and the
        # session moves to the next fence before the second worker starts.
        with session(session_id, WORKER, takeover=True) as second:
            print(f"fence {second.fence}: took over; the first run ended by {first.ended_by}", flush=True)
            print(f"fence {first.fence}'s late write: {late_write(first)}", flush=True)
            second.put("progress", b"step 2")
            print(f"progress: {second.get('progress').value!r}", flush=True)
        print(f"handed off; the second run's worker ended with status {second.status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
