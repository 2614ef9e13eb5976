"""Issue 34's 29 attacks (and two more) on the python tool, each contained: through the public entry (audit hook on) and with the
audit hook off, which shows the operating system's fence holds on its own.

"Contained" is checked from outside: a sentinel file and directory in this process's temporary directory are
neither read (their secret never comes back) nor changed (content, mode, mtime, listing); no process tagged by the
attack runs after the call; a listening socket on 127.0.0.1 gets no connection; the environment's secret does not
reach the code; every call returns within its limits. An attack that gets through prints ESCAPED.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tandemrl.rollout.catalog import build_tools
from tandemrl.rollout.sandbox import Sandbox, SandboxLimits
from tandemrl.rollout.tools import ToolRegistry

LIMITS = SandboxLimits(timeout_s=4.0, cpu_s=1, memory_mb=256, max_file_mb=1, max_output_chars=400)
SECRET = f"secret-{uuid.uuid4().hex}"
ENV_SECRET = f"env-secret-{uuid.uuid4().hex}"
TAG = f"tandemrl-attack-{uuid.uuid4().hex[:12]}"  # in the argv of every process an attack tries to leave behind


@dataclass(frozen=True)
class Host:
    """What the attacks aim at, made by this (the trainer's) process."""

    outside: Path  # a directory outside the sandbox, with secret.txt in it
    listener: socket.socket | None  # listening on 127.0.0.1, non-blocking

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1] if self.listener else 0

    @property
    def secret(self) -> Path:
        return self.outside / "secret.txt"


def subinterpreter(code: str) -> str:
    """Runs ``code`` in a subinterpreter: no audit hook there (the issue's way around the hook)."""
    return f"import _xxsubinterpreters as i\ni.run_string(i.create(isolated=False), {code!r})"


def dir_fd_chain(target: str, then: str) -> str:
    """``then`` with ``fd`` (a directory inside) and ``rel`` (a path from fd to ``target``): b/c/up is a symlink whose
    target, 'd/../../../..', the hook resolves from the working directory (where d -> x/y/z/w: inside) while the
    kernel resolves it from b/c (where d is a plain directory: the directory above the working directory)."""
    return ("import os\nos.makedirs('x/y/z/w'); os.symlink('x/y/z/w', 'd'); os.makedirs('b/c/d')\n"
            "os.symlink('d/../../../..', 'b/c/up'); fd = os.open('b/c', os.O_RDONLY)\n"
            f"rel = 'up/' + os.path.relpath({target!r}, os.path.dirname(os.getcwd()))\n{then}")


def attacks(h: Host) -> dict[str, str]:
    s, d, up = str(h.secret), str(h.outside), "../" * 12
    read = f"print('ESCAPED', open({s!r}).read())"
    write = f"open({d!r} + '/written', 'w').write('x'); print('ESCAPED')"
    run_id = "import subprocess; print('ESCAPED', subprocess.run(['id'], capture_output=True).stdout)"
    survivor = (f"import subprocess; subprocess.Popen(['/bin/sh', '-c', 'sleep 30 # {TAG}'], start_new_session=True)"
                "; print('ESCAPED spawned')")
    tcp = f"import socket; socket.create_connection(('127.0.0.1', {h.port}), timeout=2); print('ESCAPED')"
    return {
        "rename outside": f"open('f', 'w').write('x'); import os; os.rename('f', {d!r} + '/renamed'); print('ESCAPED')",
        "symlink outside": f"import os; os.symlink('/etc', {d!r} + '/link'); print('ESCAPED')",
        "hard link outside": f"open('f', 'w').write('x'); import os; os.link('f', {d!r} + '/hard'); print('ESCAPED')",
        "utime outside": f"import os; os.utime({s!r}, (0, 0)); print('ESCAPED')",
        "chmod outside": f"import os; os.chmod({s!r}, 0o777); print('ESCAPED')",
        "dir_fd read via symlink chain": dir_fd_chain(s, "print('ESCAPED', os.read(os.open(rel, os.O_RDONLY, "
                                                     "dir_fd=fd), 100))"),
        "dir_fd write via symlink chain": dir_fd_chain(d + "/written", "os.write(os.open(rel, os.O_WRONLY | "
                                                      "os.O_CREAT, dir_fd=fd), b'x'); print('ESCAPED')"),
        "subinterpreter read outside": subinterpreter(read),
        "subinterpreter write outside": subinterpreter(write),
        "subinterpreter runs id": subinterpreter(run_id),
        "subinterpreter forks": subinterpreter("import os\nif os.fork() == 0: os._exit(0)\nprint('ESCAPED')"),
        "subinterpreter new-session child survives": subinterpreter(survivor),
        "subinterpreter tcp to 127.0.0.1": subinterpreter(tcp),
        "read outside": read,
        "read outside by ..": f"print('ESCAPED', open({up!r} + {s.lstrip('/')!r}).read())",
        "read /etc/passwd": "print('ESCAPED', open('/etc/passwd').read())",
        "list outside": f"import os; print('ESCAPED', os.listdir({d!r}))",
        "write outside": write,
        "fork bomb": "import os\nwhile True: os.fork()\n",
        "threads": "import threading; threading.Thread(target=print, args=('ESCAPED',)).start()",
        "subprocess": run_id,
        "os.system": "import os; os.system('echo ESCAPED')",  # the shell's echo would print it
        "ctypes": "import ctypes; ctypes.CDLL(None).system(b'echo ESCAPED')",
        "sockets": "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2); print('ESCAPED')",
        "tcp to 127.0.0.1": tcp,
        "parent's /proc environ": (f"print('ESCAPED', open('/proc/{os.getpid()}/environ').read())\n"),
        "environment": "import os; print('ESCAPED' if any('secret' in v for v in os.environ.values()) else 'clean')",
        "memory bomb": "x = bytearray(10**10); print('ESCAPED')",
        "infinite loop": "while True: pass",
        "sleep": "import time; time.sleep(60); print('ESCAPED')",
        "huge output": "while True: print('x' * 1000)",
    }


NAMES = list(attacks(Host(Path("/x"), None)))


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Host:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text(SECRET)
    os.chmod(outside / "secret.txt", 0o600)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    yield Host(outside, listener)
    listener.close()


@pytest.fixture(scope="module")
def runners() -> dict[str, Callable[[str], str]]:
    """The issue's entry (audit hook on) and the sandbox without its audit hook (the kernel's fence alone)."""
    registry = ToolRegistry(build_tools(["python"], LIMITS))
    bare = Sandbox(LIMITS, audit_hook=False)

    def with_hook(code: str) -> str:
        return registry.call("python", {"code": code}).text

    def kernel_only(code: str) -> str:
        run = bare.run(code)
        return f"{run.stdout}\n{run.stderr}\nerror: {run.error}"

    return {"public entry": with_hook, "kernel only": kernel_only}


def test_the_issue_attacks_are_all_here():
    assert len(NAMES) >= 29  # the issue's 29, threads and /etc/passwd besides


def snapshot(h: Host) -> tuple:
    st = h.secret.stat()
    return h.secret.read_text(), st.st_mode, st.st_mtime_ns, sorted(os.listdir(h.outside))


def tagged_processes() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if TAG.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("fence", ["public entry", "kernel only"])
@pytest.mark.parametrize("name", NAMES)
def test_attack_is_contained(host, runners, fence, name, monkeypatch):
    monkeypatch.setenv("TANDEMRL_TEST_TOKEN", ENV_SECRET)  # a secret in the trainer's environment
    code = attacks(host)[name]
    before = snapshot(host)
    start = time.monotonic()
    output = runners[fence](code)
    elapsed = time.monotonic() - start
    assert "ESCAPED" not in output, (name, output)
    assert SECRET not in output and ENV_SECRET not in output and "root:x:0:0" not in output, (name, output)
    assert snapshot(host) == before, name
    assert elapsed < LIMITS.timeout_s + 5, (name, elapsed)
    time.sleep(0.05)
    survivors = tagged_processes()
    for pid in survivors:  # so that one escape does not fail the tests after it
        os.kill(int(pid), signal.SIGKILL)
    assert survivors == [], (name, "a process started by the code outlived the call")
    with pytest.raises(BlockingIOError):  # nothing connected to the trainer's loopback
        host.listener.accept()
    if name == "huge output":
        assert "output or file size limit of 1 MB exceeded" in output and len(output) < 3 * LIMITS.max_output_chars
    if name == "memory bomb":
        assert "memory limit of 256 MB exceeded" in output, output
