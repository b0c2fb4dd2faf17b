"""Run untrusted generated code (HumanEval's unit tests) in a separate, limited process.

The program runs in a fresh interpreter (`-I`: no user site, no environment variables) inside a
temporary directory, in its own session (so a timeout kills everything it started), with limits
on memory, CPU time, file size and open files set before it starts. Never in our own process.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

MEMORY_BYTES = 1 << 30
FILE_BYTES = 1 << 20


@dataclass
class Outcome:
    passed: bool
    status: str  # passed, failed, timeout
    output: str = ""


def _limits(cpu_seconds: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_program(source: str, timeout: float = 10.0) -> Outcome:
    """Run `source` as a script; passed when it exits with status 0 within `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="dyncomplete-exec-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        proc = subprocess.Popen(
            [sys.executable, "-I", path], cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
            preexec_fn=_limits(int(timeout) + 1),
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Outcome(False, "timeout")
        text = out.decode("utf-8", errors="replace")[-2000:]
        return Outcome(proc.returncode == 0, "passed" if proc.returncode == 0 else "failed", text)
