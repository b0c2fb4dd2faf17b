"""Start `dyncomplete serve` in a child process on a free loopback port and wait until it answers.

Used by `bench-session` (which measures through the real server) and by the tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(model: str, *options: str, start_timeout_s: float = 180.0, env: dict | None = None):
    """Yield (base URL, Popen) of a server started with `dyncomplete serve --model MODEL OPTIONS`."""
    port = free_port()
    cmd = [sys.executable, "-m", "dyncomplete", "serve", "--model", model, "--port", str(port), *options]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code in (200, 401):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not answer within {start_timeout_s:g} s")
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
