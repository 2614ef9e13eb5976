"""The bubblewrap command line that isolates one sandboxed run, and the probe that says whether it works here.

What the command builds (bwrap(1)): new user, mount, PID, network, IPC, UTS and cgroup namespaces; a fresh tmpfs as
the root with only the interpreter's files bind-mounted read-only (/usr, the /lib* and /bin links or dirs, the
Python prefix), a private /proc of the new PID namespace, a minimal /dev, and a size-capped tmpfs /work as the only
writable place; no capabilities, no_new_privs (bwrap always sets it), no nested user namespaces, a new session
(setsid), an empty environment, and a network namespace with only loopback. bwrap's own init is PID 1: when the
code exits, PID 1 exits, and the kernel kills every descendant; --die-with-parent kills all of it when the calling
process (or our timeout) kills bwrap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

WORKDIR = "/work"  # the code's working directory inside the sandbox (a tmpfs)
CHILD_PATH = "/sandbox/child.py"  # where sandbox_child.py is bind-mounted, read-only
SANDBOX_UID = 65534  # "nobody": the code is not uid 0 even inside its own user namespace
SYSTEM_ROOTS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`) "
                "and allow user namespaces (sysctl user.max_user_namespaces > 0, and on Debian/Ubuntu "
                "kernel.unprivileged_userns_clone = 1 or kernel.apparmor_restrict_unprivileged_userns = 0)")


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create namespaces here."""


@dataclass(frozen=True)
class BwrapPlan:
    """Everything one run needs besides the code: the interpreter and the host paths it reads."""

    bwrap: str
    python: str  # the real path of the interpreter (same path inside)
    read_only: tuple[str, ...]  # host directories bind-mounted read-only at the same path
    links: tuple[tuple[str, str], ...]  # (target, path) symlinks such as /lib -> usr/lib (merged-/usr systems)


def plan() -> BwrapPlan:
    """The interpreter of this process and the host paths it needs; SandboxUnavailable when bwrap is missing."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"tools.sandbox = 'bwrap': the `bwrap` program is not on PATH; {INSTALL_HINT}, "
                                 "or set tools.sandbox = 'none' to run model-written code unsandboxed")
    python = os.path.realpath(sys.executable)
    read_only, links = [], []
    for root in SYSTEM_ROOTS:
        if os.path.islink(root):
            links.append((os.readlink(root), root))
        elif os.path.isdir(root):
            read_only.append(root)
    for extra in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):  # pyenv, conda: outside /usr
        if not any(extra == r or extra.startswith(r + os.sep) for r in read_only):
            read_only.append(extra)
    return BwrapPlan(bwrap, python, tuple(read_only), tuple(links))


def child_argv(p: BwrapPlan, args: list[str]) -> list[str]:
    """``python -I -S child.py args`` as run inside the sandbox."""
    return [p.python, "-I", "-S", CHILD_PATH, *args]


def command(p: BwrapPlan, tmpfs_bytes: int, child: Path, argv: list[str]) -> list[str]:
    """bwrap's argument list running ``argv`` in the sandbox (the order of the mount options matters)."""
    cmd = [p.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
           "--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
           "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORKDIR,
           "--setenv", "TMPDIR", WORKDIR, "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONIOENCODING", "utf-8"]
    for path in p.read_only:
        cmd += ["--ro-bind", path, path]
    for target, path in p.links:
        cmd += ["--symlink", target, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", str(child), CHILD_PATH,
            "--size", str(tmpfs_bytes), "--tmpfs", WORKDIR, "--chdir", WORKDIR, "--remount-ro", "/"]
    return cmd + argv


def probe(p: BwrapPlan, child: Path) -> None:
    """Runs the interpreter once in the sandbox; SandboxUnavailable, with bwrap's own words, when that fails."""
    cmd = command(p, 2**20, child, [p.python, "-I", "-S", "-c", "pass"])
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SandboxUnavailable(f"tools.sandbox = 'bwrap': bwrap did not run ({err}); {INSTALL_HINT}") from err
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise SandboxUnavailable(f"tools.sandbox = 'bwrap': bwrap cannot build the sandbox here ({said}); "
                                 f"{INSTALL_HINT}, or set tools.sandbox = 'none' to run model-written code "
                                 "unsandboxed")
