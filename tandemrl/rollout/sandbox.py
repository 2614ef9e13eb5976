"""Run model-written Python in a separate process: wall-clock timeout, CPU / memory / file-size / process limits,
no network, a private temporary directory, truncated output.

Isolation, from the kernel up:
- ``resource.setrlimit`` in the child (sandbox_child.py): RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space),
  RLIMIT_FSIZE (largest file written; stdout/stderr go to files in the directory, so this caps output too),
  RLIMIT_NPROC = 0 (no fork, no thread). The kernel exempts real uid 0 from RLIMIT_NPROC (a user namespace does not
  change that): when the trainer runs as root, only the audit hook stops new processes (threads are then allowed).
- Network: the child runs in new user + network namespaces (``unshare --user --map-root-user --net``: only a down
  loopback device) when unprivileged namespaces work here; ``Sandbox.network`` says which ("namespace" or
  "audit-hook"). Either way the audit hook refuses socket creation.
- A PEP 578 audit hook installed before the code runs refuses os.system / subprocess / fork / exec, ctypes and file
  access outside the working directory (see sandbox_child.py for what it can and cannot stop).
- The wall-clock timeout kills the child's whole process group; the directory is deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tandemrl.rollout.tools import ToolResult

CHILD = Path(__file__).with_name("sandbox_child.py")
MB = 2**20


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock
    cpu_s: int = 5
    memory_mb: int = 512  # address space; Python itself needs ~30 MB
    max_file_mb: int = 4  # any file the code writes, stdout and stderr included
    max_output_chars: int = 2000  # what the model reads back

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.cpu_s < 1 or self.memory_mb < 64 or self.max_file_mb < 1:
            raise ValueError(f"sandbox limits need timeout_s > 0, cpu_s >= 1, memory_mb >= 64, max_file_mb >= 1; "
                             f"got {self}")
        if self.max_output_chars < 1:
            raise ValueError(f"sandbox max_output_chars must be >= 1, got {self.max_output_chars}")


@dataclass(frozen=True)
class SandboxRun:
    stdout: str
    stderr: str
    returncode: int | None  # None: killed at the wall-clock timeout
    error: str | None  # a one-line explanation when the run failed


def namespaces_available() -> bool:
    """Whether an unprivileged user + network namespace can be made here (probed by running `true` in one)."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(_unshare_prefix() + ["true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _unshare_prefix() -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--net"]


class Sandbox:
    """Runs code strings; one fresh directory and process per run. Thread-safe (no shared mutable state)."""

    def __init__(self, limits: SandboxLimits | None = None, use_namespace: bool | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.limits.validate()
        if use_namespace is None:
            use_namespace = namespaces_available()
        self.network = "namespace" if use_namespace else "audit-hook"

    def run(self, code: str) -> SandboxRun:
        workdir = Path(tempfile.mkdtemp(prefix="tandemrl-sandbox-"))
        try:
            (workdir / "main.py").write_text(code, encoding="utf-8")
            returncode = self._execute(workdir)
            stdout = self._read(workdir / "stdout.txt")
            stderr = self._read(workdir / "stderr.txt", tail=True)
            return SandboxRun(stdout, stderr, returncode, self._explain(returncode, stderr))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, workdir: Path) -> int | None:
        lim = self.limits
        command = [sys.executable, "-I", "-S", str(CHILD), str(lim.cpu_s), str(lim.memory_mb * MB),
                   str(lim.max_file_mb * MB)]
        if self.network == "namespace":
            command = _unshare_prefix() + command
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), "TMPDIR": str(workdir),
               "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(command, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                    start_new_session=True)  # its own process group: the timeout kills all of it
            try:
                return proc.wait(timeout=lim.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
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
        if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "Traceback" not in stderr:
            return f"killed: CPU time limit of {lim.cpu_s} s exceeded"
        if returncode == -signal.SIGXFSZ or "File too large" in stderr:
            return f"output or file size limit of {lim.max_file_mb} MB exceeded"
        last = _last_line(stderr)
        if "MemoryError" in last:
            return f"MemoryError: memory limit of {lim.memory_mb} MB exceeded"
        return last or f"exited with status {returncode}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith("[output truncated")]
    return lines[-1].strip() if lines else ""


def python_tool(sandbox: Sandbox):
    """The ``python`` tool over ``sandbox``: runs the code, returns what it printed, or a clear error."""

    def python(code: str) -> ToolResult:
        """Run Python code in a sandbox and return what it prints (use print for results)."""
        run = sandbox.run(code)
        if run.error is None:
            return ToolResult(run.stdout if run.stdout.strip() else "(no output; use print)")
        shown = f"{run.stdout}\n" if run.stdout.strip() else ""
        return ToolResult(f"{shown}error: {run.error}", error=True)

    return python
