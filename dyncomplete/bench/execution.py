"""Run untrusted generated code (HumanEval's unit tests) in a bubblewrap sandbox.

A generated program may do anything its author's model wrote, so it runs under `bwrap` (Debian's
bubblewrap) with no network (its own network namespace: 127.0.0.1 reaches nothing), its own PID
namespace (it sees and signals only its own processes, and they all die with the namespace's
init), a read-only view of /usr and the interpreter and nothing else of the machine, a private
size-limited tmpfs as its working folder, an empty environment, and, under an unprivileged uid,
limits on processes, memory, CPU time, file size and open files. A timeout kills bwrap, which
takes the whole namespace with it, and never waits on a pipe a leftover process could hold.
Where bwrap is missing or cannot create its namespaces we refuse to run anything: there is no
unsandboxed fallback.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MEMORY_BYTES = 1 << 30
FILE_BYTES = 1 << 20
TMP_BYTES = 64 << 20  # the tmpfs it works in; outside RLIMIT_AS, so bounded here
PROCESSES = 32  # tasks (threads included) of the sandbox's uid
NOBODY = 65534
INSTALL = "install bubblewrap (Debian: apt-get install bubblewrap)"


class SandboxUnavailable(FileNotFoundError):
    """No usable sandbox; a FileNotFoundError so that the CLI prints it as a one-line error."""


@dataclass
class Outcome:
    passed: bool
    status: str  # passed, failed, timeout
    output: str = ""


def run_program(source: str, timeout: float = 10.0) -> Outcome:
    """Run `source` as a script; passed when it exits with status 0 within `timeout` seconds."""
    return _run(usable_bwrap(), source, timeout)


@functools.cache
def usable_bwrap() -> str:
    """bwrap's path, once it has run an empty program here; refuses in one line otherwise."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"refusing to run generated code without a sandbox: no bwrap on PATH; {INSTALL}")
    probe = _run(bwrap, "", 10.0)
    if not probe.passed:
        said = (probe.output.strip().splitlines() or [probe.status])[-1]
        raise SandboxUnavailable(f"refusing to run generated code: bwrap cannot sandbox it here ({said}); it needs "
                                 f"PID, network and mount namespaces, and user namespaces when not run as root")
    return bwrap


def _run(bwrap: str, source: str, timeout: float) -> Outcome:
    with tempfile.TemporaryFile() as program:
        program.write(source.encode("utf-8"))
        program.flush()
        program.seek(0)
        command = _command(bwrap, program.fileno(), int(timeout) + 1)
        with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={}, pass_fds=(program.fileno(),)) as proc:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # the namespace's init dies with bwrap (--die-with-parent); the kernel kills the rest
                return Outcome(False, "timeout")
    text = out.decode("utf-8", errors="replace")[-2000:]
    return Outcome(proc.returncode == 0, "passed" if proc.returncode == 0 else "failed", text)


def _command(bwrap: str, program_fd: int, cpu_seconds: int) -> list[str]:
    prefix = Path(sys.base_prefix).resolve()
    python = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    view = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64"]
    if not prefix.is_relative_to("/usr"):  # e.g. pyenv's /root/.pyenv/versions/X: its parents made traversable
        for parent in reversed(prefix.parents[:-1]):
            view += ["--perms", "0755", "--dir", str(parent)]
        view += ["--ro-bind", str(prefix), str(prefix)]
    if os.geteuid() == 0:
        # No user namespace for root: mapped into one, it would stay uid 0 outside, which the kernel exempts from
        # RLIMIT_NPROC. bwrap keeps root's capabilities for setpriv, which drops them with the switch to nobody.
        isolate = []
        drop = ["/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--bounding-set=-all"]
    else:
        isolate, drop = ["--unshare-user"], []
    limits = ["/usr/bin/prlimit", f"--nproc={PROCESSES}", f"--as={MEMORY_BYTES}", f"--cpu={cpu_seconds}",
              f"--fsize={FILE_BYTES}", "--nofile=64", "--core=0"]
    return [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            *isolate, "--die-with-parent", "--new-session", *view, "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
            "--perms", "0444", "--file", str(program_fd), "/tmp/program.py", "--chdir", "/tmp",
            *drop, *limits, str(python), "-I", "program.py"]
