"""The sandbox for generated code: ordinary programs, limits, and hostile programs contained (issue 15).

Each hostile program here got out of the earlier runner (a process group and rlimits, as root).
"""

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dyncomplete.bench import execution
from dyncomplete.bench.execution import SandboxUnavailable, run_program

SETSID_CHILD = """
import os, time
if os.fork() == 0:
    os.setsid()  # out of the program's process group, with its copy of stdout
    os.execv('/bin/sleep', ['sleep', {marker!r}])
time.sleep(0.3)
if {hang}:
    time.sleep(60)
"""

WRITE_OUTSIDE = """
import os
open('mine', 'w').write('ok')
for path in {paths!r}:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, 'w').write('escaped')
    except OSError as exc:
        print(exc)
"""

READ_ENVIRONMENTS = """
import glob, os
print(os.environ.get('DYNCOMPLETE_TEST_SECRET'))
for path in glob.glob('/proc/[0-9]*/environ'):
    try:
        for var in open(path, 'rb').read().split(b'\\0'):
            if var.startswith(b'DYNCOMPLETE_TEST_SECRET='):
                print(path, var)
    except OSError:
        pass
"""

FORK_200 = """
import os, time
n = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n)
"""


def timed(source, timeout):
    start = time.monotonic()
    out = run_program(source, timeout=timeout)
    return out, time.monotonic() - start


def running(marker: str) -> bool:
    """Whether any process on the machine has `marker` in its command line."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                return True
        except OSError:
            pass
    return False


def test_a_program_passes_or_fails_by_its_exit_status_and_never_as_root():
    out = run_program("import os\nprint(os.getuid())\n")
    assert out.passed and int(out.output) != 0
    failed = run_program("assert 1 == 2")
    assert failed.status == "failed" and "AssertionError" in failed.output
    assert run_program("raise SystemExit(3)").status == "failed"


def test_limits_on_memory_and_file_size():
    assert "MemoryError" in run_program("x = bytearray(4 << 30)").output
    assert "File too large" in run_program("open('big', 'wb').write(b'0' * (8 << 20))").output


def test_a_timeout_returns_in_time():
    out, seconds = timed("while True: pass", timeout=1)
    assert out.status == "timeout" and seconds < 2


@pytest.mark.parametrize("hang", [False, True])
def test_a_child_in_its_own_session_holding_the_pipe_dies_with_the_program(hang):
    """Item 1: `os.setsid()` escaped killpg, and its copy of stdout kept run_program waiting."""
    marker = f"19.{uuid.uuid4().int % 10**9:09d}"  # a sleep of about 19 s, known by its odd fraction
    out, seconds = timed(SETSID_CHILD.format(marker=marker, hang=hang), timeout=2)
    assert out.status == ("timeout" if hang else "passed") and seconds < 3
    deadline = time.monotonic() + 1
    while running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(marker)


def test_no_writes_outside_its_own_folder(tmp_path):
    targets = [tmp_path / "escaped", Path(sys.base_prefix) / "escaped-from-sandbox"]
    try:
        out = run_program(WRITE_OUTSIDE.format(paths=[str(t) for t in targets]))
        assert out.passed, out.output  # its own folder is writable
        assert not any(t.exists() for t in targets)
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_no_network_even_to_localhost():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        out = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n", timeout=5)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert out.status == "failed" and "ConnectionRefusedError" in out.output


def test_cannot_signal_an_unrelated_process():
    with subprocess.Popen(["sleep", "30"]) as sleeper:
        try:
            out = run_program(f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)\n", timeout=5)
            with pytest.raises(subprocess.TimeoutExpired):
                sleeper.wait(timeout=0.5)
        finally:
            sleeper.kill()
    assert out.status == "failed" and "ProcessLookupError" in out.output


def test_cannot_read_the_callers_environment_through_proc():
    """The caller is a fresh process, so that the secret is in the environment /proc/PID/environ shows."""
    caller = ("import os\nfrom dyncomplete.bench.execution import run_program\n"
              f"print(os.environ['DYNCOMPLETE_TEST_SECRET'] in run_program({READ_ENVIRONMENTS!r}).output)\n")
    done = subprocess.run([sys.executable, "-c", caller], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DYNCOMPLETE_TEST_SECRET": uuid.uuid4().hex})
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_forks_are_capped():
    out, seconds = timed(FORK_200, timeout=5)
    assert out.passed and int(out.output) < execution.PROCESSES and seconds < 6


def test_refuses_to_run_without_a_usable_bwrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    execution.usable_bwrap.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="no bwrap on PATH; install bubblewrap"):
            run_program("print(1)")
        fake = tmp_path / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
        fake.chmod(0o755)
        with pytest.raises(SandboxUnavailable, match=r"\(bwrap: Creating new namespace failed: Operation not perm"):
            run_program("print(1)")
    finally:
        execution.usable_bwrap.cache_clear()
