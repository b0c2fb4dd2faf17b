"""One way to store a trained artefact (exit heads, classifier, stop rule, agent): float32
safetensors plus a JSON record beside it that says which weights it was trained for. Loading
refuses an artefact trained for other weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..paths import ASSETS


def default_path(model, filename: str) -> Path:
    """Where the artefact shipped for this model lives."""
    return ASSETS / model.name / filename


def model_record(model) -> dict:
    return {"model": model.name, "model_sha256": model.source_sha256}


def save_artefact(path: Path, tensors: dict[str, torch.Tensor], record: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous() for k, v in tensors.items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_record(path: Path, model, what: str) -> dict:
    """The JSON record saved beside an artefact; refuses one trained for other weights."""
    meta = json.loads(Path(path).with_suffix(".json").read_text())
    want = meta.get("model_sha256")
    if want and model.source_sha256 and want != model.source_sha256:
        raise ValueError(f"{what} {path} was trained for other weights (sha256 {want[:12]}...)")
    return meta


def load_artefact(path: Path, model, what: str, hint: str = "") -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, record) of the artefact at `path`; FileNotFoundError (with `hint`, the command that
    makes one) where there is none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}" + (f": {hint}" if hint else ""))
    meta = read_record(path, model, what)
    return load_file(str(path)), meta
