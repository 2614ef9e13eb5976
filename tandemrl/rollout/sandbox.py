"""Run model-written Python in a separate process behind the operating system's isolation: namespaces, a fresh
read-only root, no network, a PID namespace, rlimits; a wall-clock timeout; truncated output.

Isolation (``SandboxLimits.isolation``, the config's ``tools.sandbox``):
- "bwrap" (the default): bubblewrap (sandbox_bwrap.py) runs the child in new user, mount, PID, network, IPC, UTS
  and cgroup namespaces, on a tmpfs root that holds only the interpreter's files (read-only) and a size-capped
  writable /work; no capabilities, no_new_privs, an empty environment. When the code exits, every process it
  started dies with the PID namespace. Where bwrap is missing or cannot make namespaces, building a Sandbox fails
  with SandboxUnavailable, a message saying what to install or enable.
- "none": an explicit opt-out, logged as a warning: the child runs as a plain process (rlimits and the audit hook
  only, both escapable). For trusted code only.
- In both, ``resource.setrlimit`` in the child (sandbox_child.py): RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE (stdout and
  stderr are files, so this caps output too) and RLIMIT_NPROC = 0 (no fork, no thread). The kernel exempts uid 0
  from RLIMIT_NPROC, and bwrap started by root maps the code to uid 0 outside: as root, a pids cgroup per run
  (sandbox_cgroup.py) is the kernel's cap on processes instead.
- A PEP 578 audit hook is the second fence (see sandbox_child.py).
- The code goes in on stdin and stdout/stderr come back through files of a private directory the sandbox never
  sees; the wall-clock timeout kills the whole run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from tandemrl.rollout import sandbox_bwrap, sandbox_cgroup
from tandemrl.rollout.sandbox_bwrap import SandboxUnavailable
from tandemrl.rollout.tools import ToolResult

CHILD = Path(__file__).with_name("sandbox_child.py")
MB = 2**20
WORKDIR_FILES = 8  # /work (a tmpfs) holds at most this many max_file_mb
Isolation = Literal["bwrap", "none"]
logger = logging.getLogger(__name__)

__all__ = ["Sandbox", "SandboxLimits", "SandboxRun", "SandboxUnavailable", "python_tool"]


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock
    cpu_s: int = 5
    memory_mb: int = 512  # address space; Python itself needs ~30 MB
    max_file_mb: int = 4  # any file the code writes, stdout and stderr included
    max_output_chars: int = 2000  # what the model reads back
    isolation: Isolation = "bwrap"  # "none": unsandboxed (tools.sandbox)

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.cpu_s < 1 or self.memory_mb < 64 or self.max_file_mb < 1:
            raise ValueError(f"sandbox limits need timeout_s > 0, cpu_s >= 1, memory_mb >= 64, max_file_mb >= 1; "
                             f"got {self}")
        if self.max_output_chars < 1:
            raise ValueError(f"sandbox max_output_chars must be >= 1, got {self.max_output_chars}")
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(f"tools.sandbox must be 'bwrap' or 'none', got {self.isolation!r}")


@dataclass(frozen=True)
class SandboxRun:
    stdout: str
    stderr: str
    returncode: int | None  # None: killed at the wall-clock timeout
    error: str | None  # a one-line explanation when the run failed


class Sandbox:
    """Runs code strings; one fresh sandbox per run. Thread-safe (no shared mutable state).

    ``audit_hook=False`` leaves out the second fence: tests use it to show the kernel's fence holds on its own.
    """

    def __init__(self, limits: SandboxLimits | None = None, audit_hook: bool = True) -> None:
        self.limits = limits or SandboxLimits()
        self.limits.validate()
        self.audit_hook = audit_hook
        self.isolation = self.limits.isolation
        self._plan: sandbox_bwrap.BwrapPlan | None = None
        self._cgroups: Path | None = None  # where each run's pids cgroup is made (root only)
        if self.isolation == "none":
            logger.warning("tools.sandbox = 'none': model-written code runs UNSANDBOXED (rlimits and an audit hook "
                           "only, both escapable); use it for trusted code only")
            return
        self._plan = sandbox_bwrap.plan()
        sandbox_bwrap.probe(self._plan, CHILD)
        if os.geteuid() == 0:
            self._cgroups = sandbox_cgroup.pids_parent()
            if self._cgroups is None:
                logger.warning("sandbox: running as root without a writable pids cgroup: the kernel does not cap "
                               "the sandbox's processes (root is exempt from RLIMIT_NPROC); only the audit hook "
                               "and the timeout stop a fork bomb")

    def run(self, code: str) -> SandboxRun:
        private = Path(tempfile.mkdtemp(prefix="tandemrl-sandbox-"))  # the host side: never mounted in the sandbox
        try:
            (private / "code.py").write_text(code, encoding="utf-8")
            returncode = self._execute(private)
            stdout = self._read(private / "stdout.txt")
            stderr = self._read(private / "stderr.txt", tail=True)
            return SandboxRun(stdout, stderr, returncode, self._explain(returncode, stderr))
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _execute(self, private: Path) -> int | None:
        cgroup = sandbox_cgroup.create(self._cgroups, private.name) if self._cgroups is not None else None
        command, cwd = self._command(private)
        if cgroup is not None:
            command = cgroup.join_command(command)
        try:
            with open(private / "code.py", "rb") as code, open(private / "stdout.txt", "wb") as out, \
                    open(private / "stderr.txt", "wb") as err:
                return self._wait(command, cwd, code, out, err)
        finally:
            if cgroup is not None:
                cgroup.remove()

    def _command(self, private: Path) -> tuple[list[str], Path]:
        lim = self.limits
        args = [str(lim.cpu_s), str(lim.memory_mb * MB), str(lim.max_file_mb * MB), "hook" if self.audit_hook else
                "off"]
        if self._plan is None:  # isolation = "none": a plain process in a directory of its own
            (private / "work").mkdir()
            return [sys.executable, "-I", "-S", str(CHILD), *args], private / "work"
        argv = sandbox_bwrap.child_argv(self._plan, args)
        return sandbox_bwrap.command(self._plan, WORKDIR_FILES * lim.max_file_mb * MB, CHILD, argv), private

    def _wait(self, command: list[str], cwd: Path, code: IO[bytes], out: IO[bytes], err: IO[bytes]) -> int | None:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "TMPDIR": str(cwd), "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8"}  # nothing of the trainer's environment (tokens, keys) reaches the code
        proc = subprocess.Popen(command, cwd=cwd, stdin=code, stdout=out, stderr=err, env=env,
                                start_new_session=True)  # its own process group: the timeout kills all of it
        try:
            return proc.wait(timeout=self.limits.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap: --die-with-parent takes the PID namespace down with it
            proc.wait()
            return None

    def _read(self, path: Path, tail: bool = False) -> str:
        """The file's text cut to ``max_output_chars``: its head (stdout) or its tail (stderr: the error is last)."""
        limit, size = self.limits.max_output_chars, path.stat().st_size
        with open(path, "rb") as f:
            if tail:
                f.seek(max(0, size - limit * 4))
            data = f.read(limit * 4)
        text = data.decode("utf-8", errors="replace")
        if len(text) <= limit and len(data) == size:
            return text
        note = f"[output truncated: {size} bytes in all, {limit} characters shown]"
        return f"{note}\n{text[-limit:]}" if tail else f"{text[:limit]}\n{note}"

    def _explain(self, returncode: int | None, stderr: str) -> str | None:
        lim = self.limits
        if returncode is None:
            return f"timed out after {lim.timeout_s:g} s (wall clock) and was killed"
        if returncode == 0:
            return None
        killed_by = self._signal(returncode)
        if killed_by in (signal.SIGXCPU, signal.SIGKILL) and "Traceback" not in stderr:
            return f"killed: CPU time limit of {lim.cpu_s} s exceeded"
        if killed_by == signal.SIGXFSZ or "File too large" in stderr:
            return f"output or file size limit of {lim.max_file_mb} MB exceeded"
        last = _last_line(stderr)
        if "MemoryError" in last:
            return f"MemoryError: memory limit of {lim.memory_mb} MB exceeded"
        return last or f"exited with status {returncode}"


    def _signal(self, returncode: int) -> int | None:
        """The signal that killed the code: a negative status, or bwrap's 128 + signal."""
        if returncode < 0:
            return -returncode
        return returncode - 128 if self._plan is not None and returncode > 128 else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith("[output truncated")]
    return lines[-1].strip() if lines else ""


def python_tool(sandbox: Sandbox):
    """The ``python`` tool over ``sandbox``: runs the code, returns what it printed, or a clear error."""

    def python(code: str) -> ToolResult:
        """Run Python code in a sandbox and return what it prints (use print for results)."""
        run = sandbox.run(code)
        if run.error is None:  # what went to stderr (warnings, print(file=sys.stderr)) is the code's output too
            said = [run.stdout] if run.stdout.strip() else []
            if run.stderr.strip():
                said.append(f"stderr:\n{run.stderr}")
            return ToolResult("\n".join(said) or "(no output; use print)")
        shown = f"{run.stdout}\n" if run.stdout.strip() else ""
        return ToolResult(f"{shown}error: {run.error}", error=True)

    return python
