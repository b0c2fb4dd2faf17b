"""Start `dyncomplete serve` in a child process on a free loopback port and wait until it answers.

Used by `bench-session` (which measures through the real server) and by the tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(model: str, *options: str, start_timeout_s: float = 180.0, env: dict | None = None):
    """Yield (base URL, Popen) of a server started with `dyncomplete serve --model MODEL OPTIONS`.
    Its stderr is read all along (a full pipe would block the server's logging) and its end shown
    if it exits early."""
    port = free_port()
    cmd = [sys.executable, "-m", "dyncomplete", "serve", "--model", model, "--port", str(port), *options]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    tail: deque[str] = deque(maxlen=100)
    reader = threading.Thread(target=lambda: tail.extend(proc.stderr), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                reader.join(timeout=5)
                raise RuntimeError(f"server exited with {proc.returncode}: {''.join(tail)[-2000:]}")
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
