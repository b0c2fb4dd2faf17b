"""Shared fixtures: the real models, loaded once per test session, and real servers.

Tests that need model weights carry the `model` marker, written where they are (`pytestmark =
pytest.mark.model` for a file of such tests): `pytest -m "not model"` is the fast tier (no weights
needed). Helpers that test files share are in `helpers.py`.
"""

from contextlib import ExitStack

import pytest
from helpers import PRESETS

from dyncomplete.models import load


@pytest.fixture(scope="session")
def smollm():
    """SmolLM2-135M in float32 (the dtype in which identity is tested, see docs/metrics.md)."""
    return load("smollm2-135m", dtype="float32", progress=lambda m: None)


@pytest.fixture(scope="session")
def smollm_bf16():
    return load("smollm2-135m", dtype="bfloat16", progress=lambda m: None)


@pytest.fixture(scope="session")
def smollm_int4():
    """SmolLM2-135M with int4 weights on decode.c's kernels, as `--quant auto` loads it."""
    return load("smollm2-135m", dtype="bfloat16", quant="int4", progress=lambda m: None)


@pytest.fixture(scope="session")
def qwen05():
    """Qwen2.5-Coder-0.5B in float32 where its packages are installed (install.sh installs them)."""
    from dyncomplete.models import REGISTRY

    if not REGISTRY["qwen2.5-coder-0.5b"].installed():
        pytest.skip("qwen2.5-coder-0.5b is not installed: run `dyncomplete install qwen2.5-coder-0.5b`")
    return load("qwen2.5-coder-0.5b", dtype="float32", progress=lambda m: None)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """server(PRESET) -> (base URL, Popen) of a real `dyncomplete serve` of `helpers.PRESETS[PRESET]`
    on a free port: started at the first call in a test module, stopped at the module's end
    (skipped where the preset's model is not installed)."""
    from dyncomplete.bench.launch import running_server
    from dyncomplete.models import REGISTRY

    started = {}

    def start(name: str):
        if name not in started:
            preset = PRESETS[name]
            if not REGISTRY[preset.model].installed():
                pytest.skip(f"{preset.model} is not installed: run `dyncomplete install {preset.model}`")
            options = list(preset.options)
            if preset.key_file is not None:
                key_file = tmp_path_factory.mktemp("key") / "api-key"
                key_file.write_text(f"  {preset.key_file}\n")
                options += ["--api-key-file", str(key_file)]
            started[name] = servers.enter_context(running_server(preset.model, *options))
        return started[name]

    with ExitStack() as servers:
        yield start


@pytest.fixture
def served(server):
    """The "smollm" preset, which most server tests share."""
    return server("smollm")
