"""Runs inside the sandbox's child process, before the model's code: resource limits, then an audit hook, then the
code. Kept free of tandemrl imports: the child starts with ``python -I`` (no site dir, no PYTHONPATH).

The audit hook (PEP 578) refuses new processes (os.system, subprocess, fork, exec, spawn), sockets, ctypes, and
file access outside the working directory (reads are also allowed under the interpreter's own import paths). It
is a second line behind the kernel's limits (rlimits, the network namespace): code inside one process can in
principle get around an audit hook, it cannot get around an rlimit.
"""

import os
import resource
import sys

BLOCKED_EVENTS = {
    "os.system": "os.system", "subprocess.Popen": "subprocess", "os.fork": "fork", "os.forkpty": "fork",
    "os.exec": "exec", "os.posix_spawn": "spawn", "os.spawn": "spawn", "os.startfile": "startfile",
    "socket.__new__": "sockets (no network)", "socket.connect": "sockets (no network)",
    "ctypes.dlopen": "ctypes", "ctypes.dlsym": "ctypes", "os.chdir": "chdir", "pty.spawn": "pty",
}
# Modules that start processes or call C without an audit event of their own (subprocess's audit event is raised in
# Python code above _posixsubprocess.fork_exec).
BLOCKED_MODULES = {"_posixsubprocess": "subprocess", "_ctypes": "ctypes", "ctypes": "ctypes"}
PATH_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree",
               "os.chmod", "os.symlink", "os.link", "os.truncate", "os.walk"}


class SandboxViolation(PermissionError):
    pass


def set_limits(cpu_s, memory_bytes, file_bytes):
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no new process or thread at all
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


READ_EVENTS = {"open", "os.listdir", "os.scandir", "os.walk"}


def is_read(event, args):
    """Whether the event only reads (opens for reading, lists a directory)."""
    if event not in READ_EVENTS:
        return False
    if event != "open":
        return True
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
    if isinstance(mode, str) and set(mode) & set("wax+"):
        return False
    return not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)


def make_hook(workdir, read_roots):
    workdir = os.path.realpath(workdir)
    read_roots = tuple(os.path.realpath(r) for r in read_roots)

    def inside(path, roots):
        real = os.path.realpath(os.path.join(workdir, path))
        return any(real == r or real.startswith(r + os.sep) for r in roots)

    def hook(event, args):
        if event in BLOCKED_EVENTS:
            raise SandboxViolation(f"sandbox: {BLOCKED_EVENTS[event]} is not allowed")
        if event == "import" and args and args[0] in BLOCKED_MODULES:
            raise SandboxViolation(f"sandbox: {BLOCKED_MODULES[args[0]]} is not allowed")
        if event in PATH_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            roots = (workdir,) + (read_roots if is_read(event, args) else ())
            if not inside(path, roots):
                raise SandboxViolation(f"sandbox: access to {path!r} outside the working directory is not allowed")

    return hook


def main():
    cpu_s, memory_bytes, file_bytes = (int(a) for a in sys.argv[1:4])
    workdir = os.getcwd()
    source = open("main.py", encoding="utf-8").read()
    read_roots = [p for p in sys.path if p and os.path.isdir(p)]
    set_limits(cpu_s, memory_bytes, file_bytes)
    sys.addaudithook(make_hook(workdir, read_roots))
    sys.argv = ["main.py"]
    code = compile(source, "main.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
