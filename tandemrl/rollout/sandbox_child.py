"""Runs inside the sandbox's child process, before the model's code: reads the code from stdin, sets resource
limits, installs an audit hook, then runs the code. Kept free of tandemrl imports: the child starts with
``python -I -S`` (no site dir, no PYTHONPATH), inside bwrap's namespaces (sandbox_bwrap.py) unless the config opted
out (tools.sandbox = "none").

The audit hook (PEP 578) refuses new processes (os.system, subprocess, fork, exec, spawn), sockets, ctypes,
subinterpreters (they run without this hook), dir_fd-relative paths, and file access outside the working directory
(reads are also allowed under the interpreter's own import paths). It is the second fence: code inside one process
can get around an audit hook (e.g. by editing its tables through gc); the first fence is the kernel's (namespaces,
a read-only root, rlimits, a pids cgroup), which it cannot get around.
"""

import os
import resource
import sys

BLOCKED_EVENTS = {
    "os.system": "os.system", "subprocess.Popen": "subprocess", "os.fork": "fork", "os.forkpty": "fork",
    "os.exec": "exec", "os.posix_spawn": "spawn", "os.spawn": "spawn", "os.startfile": "startfile",
    "socket.__new__": "sockets (no network)", "socket.connect": "sockets (no network)",
    "ctypes.dlopen": "ctypes", "ctypes.dlsym": "ctypes", "os.chdir": "chdir", "pty.spawn": "pty",
    "os.fchdir": "chdir",
}
# Modules that start processes or call C without an audit event of their own (subprocess's audit event is raised in
# Python code above _posixsubprocess.fork_exec).
SUBINTERPRETERS = "subinterpreters (they run without the audit hook)"
BLOCKED_MODULES = {"_posixsubprocess": "subprocess", "_ctypes": "ctypes", "ctypes": "ctypes",
                   "_xxsubinterpreters": SUBINTERPRETERS, "_xxinterpchannels": SUBINTERPRETERS,
                   "_interpreters": SUBINTERPRETERS, "_interpchannels": SUBINTERPRETERS,
                   "_interpqueues": SUBINTERPRETERS}
PATH_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree",
               "os.chmod", "os.symlink", "os.link", "os.truncate", "os.walk", "os.utime", "os.chown", "os.chflags",
               "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.move"}
TWO_PATH_EVENTS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
                   "shutil.move"}  # the second path (the destination) must be inside too
# where each event carries its dir_fd arguments: a path relative to a directory fd opened elsewhere escapes the check
DIR_FD_ARGS = {"os.rename": (2, 3), "os.link": (2, 3), "os.symlink": (2,), "os.chmod": (2,), "os.chown": (3,),
               "os.utime": (3,), "os.remove": (1,), "os.rmdir": (1,), "os.mkdir": (2,)}
READ_EVENTS = {"open", "os.listdir", "os.scandir", "os.walk"}  # allowed under the import paths too, when reading


class SandboxViolation(PermissionError):
    pass


def set_limits(cpu_s, memory_bytes, file_bytes):
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no new process or thread at all
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))



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

    def check(path, roots):
        if isinstance(path, (str, bytes, os.PathLike)) and not inside(os.fsdecode(path), roots):
            raise SandboxViolation(f"sandbox: access to {os.fsdecode(path)!r} outside the working directory is "
                                   "not allowed")

    def hook(event, args):
        if event in BLOCKED_EVENTS:
            raise SandboxViolation(f"sandbox: {BLOCKED_EVENTS[event]} is not allowed")
        if event == "import" and args and args[0] in BLOCKED_MODULES:
            raise SandboxViolation(f"sandbox: {BLOCKED_MODULES[args[0]]} is not allowed")
        if any(i < len(args) and args[i] not in (None, -1) for i in DIR_FD_ARGS.get(event, ())):
            raise SandboxViolation("sandbox: dir_fd is not allowed")
        if event in PATH_EVENTS and args:
            check(args[0], (workdir,) + (read_roots if is_read(event, args) else ()))
            if event in TWO_PATH_EVENTS and len(args) > 1:
                check(args[1], (workdir,))

    return hook


def read_code():
    """The code arrives on stdin (the parent's private file); stdin then reads nothing."""
    source = sys.stdin.buffer.read().decode("utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return source


def main():
    cpu_s, memory_bytes, file_bytes = (int(a) for a in sys.argv[1:4])
    audit = sys.argv[4] == "hook"  # "off" only in tests that show the kernel's fence holds on its own
    workdir = os.getcwd()
    source = read_code()
    read_roots = [p for p in sys.path if p and os.path.isdir(p)]
    set_limits(cpu_s, memory_bytes, file_bytes)
    if audit:
        sys.addaudithook(make_hook(workdir, read_roots))
    sys.argv = ["main.py"]
    code = compile(source, "main.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
