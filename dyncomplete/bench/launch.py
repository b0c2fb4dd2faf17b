"""Start a completion server in a child process on a free loopback port and wait until it answers:
`dyncomplete serve`, or llama.cpp's `llama-server` as built by install-reference.sh.

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
from pathlib import Path

import httpx

from ..paths import cache_root

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp install-reference.sh builds
LLAMA_SERVER_THREADS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(cmd: list[str], port: int, start_timeout_s: float, env: dict | None = None):
    """Yield (base URL, Popen) of `cmd`, a server listening on `port`, once its /health answers.
    Its stderr is read all along (a full pipe would block the server's logging) and its end shown
    if it exits early."""
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    tail: deque[str] = deque(maxlen=100)
    reader = threading.Thread(target=lambda: tail.extend(proc.stderr), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                reader.join(timeout=5)
                raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}: {''.join(tail)[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code in (200, 401):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{Path(cmd[0]).name} did not answer within {start_timeout_s:g} s")
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def running_server(model: str, *options: str, start_timeout_s: float = 180.0, env: dict | None = None):
    """`dyncomplete serve --model MODEL OPTIONS`, as `running` yields it."""
    port = free_port()
    cmd = [sys.executable, "-m", "dyncomplete", "serve", "--model", model, "--port", str(port), *options]
    return running(cmd, port, start_timeout_s, env)


def llama_cpp_binary(name: str) -> Path:
    path = cache_root() / "llama.cpp" / LLAMA_CPP_VERSION / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: run ./install-reference.sh")
    return path


def running_llama_server(gguf: Path, *options: str, start_timeout_s: float = 180.0):
    """`llama-server` on the GGUF file with LLAMA_SERVER_THREADS threads and OPTIONS, as `running` yields it."""
    port = free_port()
    cmd = [str(llama_cpp_binary("llama-server")), "-m", str(gguf), "-t", str(LLAMA_SERVER_THREADS),
           "--host", "127.0.0.1", "--port", str(port), *options]
    return running(cmd, port, start_timeout_s)
