"""A pids cgroup per sandboxed run: the kernel's cap on processes when the trainer runs as root.

RLIMIT_NPROC = 0 (set in sandbox_child.py) stops every fork and thread, except that the kernel exempts processes
whose real uid is 0 outside all user namespaces; bwrap started by root maps the sandbox's uid to 0, so a fork bomb
would run. A pids cgroup holds the run (bwrap, its init, the interpreter) and refuses a fourth task: fork and
thread creation fail with EAGAIN. cgroup v1 (a ``pids`` hierarchy) and v2 (``pids`` in the subtree_control of the
cgroup we run in) both work.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# outer bwrap, bwrap's init (PID 1 inside), the interpreter: any further task is refused
SANDBOX_TASKS = 3
PREFIX = "tandemrl-sandbox-"


@dataclass(frozen=True)
class PidsCgroup:
    path: Path

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def join_command(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the cgroup: every process it starts is held."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs), *argv]

    def remove(self) -> None:
        """rmdir once the killed tasks are gone (the kernel reaps a PID namespace asynchronously)."""
        for _ in range(200):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)


def pids_parent() -> Path | None:
    """The pids cgroup directory this process lives in, where new child cgroups can be made; None when none."""
    own = _own_cgroups()
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount, kind, options = line.split()[:4]
        if kind == "cgroup" and "pids" in options.split(",") and "pids" in own:
            parent = Path(mount + own["pids"])
        elif kind == "cgroup2" and "" in own:
            parent = Path(mount + own[""])
            control = parent / "cgroup.subtree_control"
            if not control.exists() or "pids" not in control.read_text().split():
                continue
        else:
            continue
        if os.access(parent, os.W_OK):
            return parent
    return None


def create(parent: Path, tag: str) -> PidsCgroup:
    path = parent / f"{PREFIX}{os.getpid()}-{tag}"
    path.mkdir()
    (path / "pids.max").write_text(str(SANDBOX_TASKS))
    return PidsCgroup(path)


def _own_cgroups() -> dict[str, str]:
    """controller -> this process's cgroup path ("" is the v2 hierarchy), from /proc/self/cgroup."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path.rstrip("/")
    return own
