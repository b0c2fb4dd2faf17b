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
