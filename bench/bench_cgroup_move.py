"""What moving a gate into its session cgroup costs, by how long the machine's cgroups were idle
before: the kernel takes cgroup_threadgroup_rwsem for writing, and after an idle spell that means
waiting for an RCU grace period first, unless the cgroup2 mount has `favordynmods`. Each commit
does one move (the agent's attestation), so this is part of every `run` start and every takeover.
Prints numbers; asserts nothing; changes no mount option. Run as root:
.venv/bin/python bench/bench_cgroup_move.py
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import time
from pathlib import Path

from holdfast.proc import cgroups

MOVES = 15


def moves_ms(parent: Path, idle_s: float) -> list[float]:
    made, samples = [], []
    try:
        for _ in range(MOVES):
            child = subprocess.Popen(["sleep", "30"])
            path = parent / f"holdfast-bench-move-{secrets.token_hex(4)}"
            path.mkdir()
            made.append((path, child))
            time.sleep(idle_s)  # the idle spell is the variable measured
            t = time.perf_counter()
            (path / "cgroup.procs").write_text(str(child.pid))
            samples.append((time.perf_counter() - t) * 1000)
    finally:
        for path, child in made:
            child.kill()
            child.wait()
            (path / "cgroup.kill").write_text("1")  # nothing left behind once it reads populated 0
            deadline = time.monotonic() + 5
            while b"populated 1" in (path / "cgroup.events").read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
            path.rmdir()
    return samples


def main() -> None:
    root = Path(cgroups.cgroup2_root())
    options = next((line.split()[3] for line in Path("/proc/mounts").read_text().splitlines()
                    if line.split()[1] == str(root)), "?")
    relative = Path("/proc/self/cgroup").read_text().strip().splitlines()[-1].split(":", 2)[2]
    parent = Path(os.path.normpath(f"{root}{relative}"))
    print(f"cgroup2 at {root} ({options}); moves into new children of {parent}")
    for idle in (0.0, 0.01, 0.03, 0.1):
        samples = moves_ms(parent, idle)
        print(f"after {idle * 1000:4.0f} ms idle: move p50 {statistics.median(samples):6.2f} ms, "
              f"max {max(samples):6.2f} ms (n={len(samples)})")


if __name__ == "__main__":
    main()
