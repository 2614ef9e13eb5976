"""The Python sandbox: each attack of the issue comes back as a clear error and the calling process is unharmed."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from tandemrl.rollout.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, python_tool

# a generous wall clock: on a loaded machine the CPU limit must be what stops the loop, not the timeout
LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=1, memory_mb=256, max_file_mb=1, max_output_chars=300)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS)


def test_runs_code_and_returns_output(sandbox):
    run = sandbox.run("import math, json\nprint(json.dumps([math.factorial(5)]))\nopen('f.txt', 'w').write('x')\n"
                      "print(open('f.txt').read())")
    assert run.error is None and run.stdout == "[120]\nx\n"


@pytest.mark.parametrize("name, code, error", [
    ("memory bomb", "x = bytearray(10**10)", "MemoryError: memory limit of 256 MB exceeded"),
    ("growing memory", "x = []\nwhile True: x.append(' ' * 10**6)", "MemoryError: memory limit of 256 MB exceeded"),
    ("fork bomb", "import os\nwhile True: os.fork()", "sandbox: fork is not allowed"),
    ("os.system", "import os; os.system('touch /tmp/pwned-by-sandbox-test')", "sandbox: os.system is not allowed"),
    ("subprocess", "import subprocess; subprocess.run(['ls', '/'])", "sandbox: subprocess is not allowed"),
    ("raw fork_exec", "import _posixsubprocess", "sandbox: subprocess is not allowed"),
    ("ctypes", "import ctypes; ctypes.CDLL(None).system(b'ls')", "sandbox: ctypes is not allowed"),
    ("read outside", "print(open('/etc/hostname').read())", "access to '/etc/hostname' outside the working directory"),
    ("list outside", "import os; print(os.listdir('/'))", "access to '/' outside the working directory"),
    ("escape by ..", "print(open('../../etc/hostname').read())", "outside the working directory"),
    ("socket", "import socket; socket.socket().connect(('8.8.8.8', 53))",
     "sandbox: sockets (no network) is not allowed"),
    ("huge file", "open('big', 'w').write('a' * 10**8)", "file size limit of 1 MB exceeded"),
    ("exception", "1/0", "ZeroDivisionError: division by zero"),
])
def test_attacks_are_clear_errors(sandbox, name, code, error):
    run = sandbox.run(code)
    assert run.error is not None and error in run.error, (name, run)
    assert not os.path.exists("/tmp/pwned-by-sandbox-test")


def test_infinite_loop_is_stopped(sandbox):
    run = sandbox.run("while True: pass")
    # the CPU limit (1 s) or, on a very loaded machine, the wall clock (10 s) stops it
    assert run.error in ("killed: CPU time limit of 1 s exceeded", "timed out after 10 s (wall clock) and was killed")


def test_wall_clock_timeout():
    run = Sandbox(SandboxLimits(timeout_s=0.5, cpu_s=5)).run("import time; time.sleep(30)")
    assert run.returncode is None and run.error == "timed out after 0.5 s (wall clock) and was killed"


def test_huge_output_is_truncated(sandbox):
    run = sandbox.run("while True: print('x' * 1000)")
    assert run.error == "output or file size limit of 1 MB exceeded"
    assert run.stdout.startswith("x" * 300) and "[output truncated: 1048576 bytes in all, 300 characters shown]" \
        in run.stdout
    small = sandbox.run("print('y' * 5000)")
    assert small.error is None and len(small.stdout) < 400 and "5001 bytes in all" in small.stdout


def test_network_namespace_has_no_route():
    """The kernel's fence on its own (no audit hook): the sandbox's network namespace has no route out."""
    code = ("import socket\ntry:\n    socket.create_connection(('10.1.2.3', 9), timeout=2)\n"
            "except OSError as e:\n    print(type(e).__name__, e.errno)")
    run = Sandbox(LIMITS, audit_hook=False).run(code)
    assert run.stdout.strip() == f"OSError {errno.ENETUNREACH}", run


def test_sandbox_sees_a_fresh_read_only_root():
    code = ("import os\nprint(sorted(os.listdir('/')), os.getcwd(), os.getuid())\n"
            "try:\n    open('/usr/x', 'w')\nexcept OSError as e:\n    print(e.errno)")
    run = Sandbox(LIMITS, audit_hook=False).run(code)
    top, rest = run.stdout.split("]", 1)
    assert "etc" not in top and "home" not in top and "tmp" not in top and "work" in top, run
    assert rest.split() == ["/work", "65534", str(errno.EROFS)], run


def test_missing_bwrap_is_a_clear_refusal(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap.*tools.sandbox = 'none'"):
        Sandbox(LIMITS)


def test_unsandboxed_opt_in_is_logged_and_keeps_the_audit_hook(caplog):
    with caplog.at_level(logging.WARNING, logger="tandemrl.rollout.sandbox"):
        sandbox = Sandbox(SandboxLimits(**{**LIMITS.__dict__, "isolation": "none"}))
    assert "tools.sandbox = 'none'" in caplog.text and "UNSANDBOXED" in caplog.text
    run = sandbox.run("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)")
    assert "sockets (no network) is not allowed" in run.error
    assert sandbox.run("print(6 * 7)").stdout == "42\n"


def test_isolation_is_checked():
    with pytest.raises(ValueError, match="tools.sandbox must be 'bwrap' or 'none'"):
        SandboxLimits(isolation="docker").validate()  # type: ignore[arg-type]


def test_python_tool_reports_errors_to_the_model(sandbox):
    tool = python_tool(sandbox)
    assert tool("print(6 * 7)").text == "42\n"
    failed = tool("print('partial')\nimport os; os.system('ls')")
    assert failed.error and failed.text == "partial\n\nerror: SandboxViolation: sandbox: os.system is not allowed"
    assert tool("x = 1").text == "(no output; use print)"
    assert tool("import sys; sys.stderr.write('careful')").text == "stderr:\ncareful"
    assert tool("import sys; print(1); sys.stderr.write('careful')").text == "1\n\nstderr:\ncareful"


def test_a_sandbox_failure_is_a_tool_message_and_the_trajectory_goes_on(sandbox):
    from tandemrl.rollout.tool_format import PlainFormat
    from tandemrl.rollout.tools import ToolRegistry, make_tool
    from tandemrl.rollout.trajectory import AgentLimits, Phase, TrajectorySpec, TrajectoryState, run_calls
    from tandemrl.types import Rollout, SamplingParams

    state = TrajectoryState(TrajectorySpec("t", [1], SamplingParams()), PlainFormat(), AgentLimits())
    text = "<call>python x = bytearray(10**10)</call>"
    state.on_turn(Rollout("t#0", [1], [5, 6], [0.0, 0.0], "stop", text=text), text, ended_by_eos=False)
    registry = ToolRegistry([make_tool(python_tool(sandbox), name="python")])
    results = run_calls(state.pending_calls, registry.call, state.spec.context)
    assert results[0].error and results[0].text == "error: MemoryError: memory limit of 256 MB exceeded"
    state.on_results(results, lambda t: [7] * len(t))
    assert state.phase is Phase.GENERATING and state.records[0].error


@pytest.mark.parametrize("audit_hook", [True, False])
def test_kernel_process_limit(audit_hook):
    """Starting a thread raises no audit event: the kernel stops it (RLIMIT_NPROC = 0, or as root, where that limit
    does not apply, the run's pids cgroup)."""
    run = Sandbox(LIMITS, audit_hook=audit_hook).run(
        "import threading\nthreading.Thread(target=print, args=('thread ran',)).start()")
    assert "thread ran" not in run.stdout and run.error == "RuntimeError: can't start new thread"


def test_pid_namespace_takes_every_descendant_down(tmp_path):
    """The sandbox's command with fork allowed (no child.py, no limits): a daemonised grandchild in a session of its
    own is gone the moment the command returns, because it lived in the PID namespace."""
    import subprocess
    import time
    import uuid

    from tandemrl.rollout import sandbox_bwrap
    from tandemrl.rollout.sandbox import CHILD

    tag = f"tandemrl-survivor-{uuid.uuid4().hex[:8]}"
    plan = sandbox_bwrap.plan()
    script = f"setsid /bin/sh -c 'sleep 30 # {tag}' </dev/null >/dev/null 2>&1 & sleep 0.2; echo started"
    done = subprocess.run(sandbox_bwrap.command(plan, 2**20, CHILD, ["/bin/sh", "-c", script]), capture_output=True,
                          text=True, timeout=30)
    assert done.stdout.strip() == "started", done
    time.sleep(0.1)
    alive = [pid for pid in filter(str.isdigit, os.listdir("/proc")) if _cmdline_has(pid, tag)]
    assert alive == []


def _cmdline_has(pid: str, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return tag.encode() in f.read()
    except OSError:
        return False
