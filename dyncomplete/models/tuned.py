"""Models fine-tuned here: a registered base model plus a LoRA adapter kept in the package's
assets, merged into the base weights at load. `ALIAS-lite` is ALIAS after `train-lite` (LITE:
every exit layer made readable by the final norm and LM head); exit heads and the other trained
artefacts of the tuned model live beside its adapter, under its own name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..paths import ASSETS
from .registry import REGISTRY, ModelError, sha256_of

SUFFIX = "-lite"
ADAPTER = "lite_adapter"
RECORD = "lite.json"


def tuned_base(name: str) -> str | None:
    """The registered base of a tuned model's name, None for any other name."""
    base = name.removesuffix(SUFFIX)
    return base if name.endswith(SUFFIX) and base in REGISTRY else None


def adapter_dir(name: str) -> Path:
    return ASSETS / name / ADAPTER


def has_adapter(name: str) -> bool:
    return (adapter_dir(name) / "adapter_config.json").is_file()


def shipped() -> list[str]:
    """The tuned models whose adapter ships in the assets."""
    return [alias + SUFFIX for alias in REGISTRY if has_adapter(alias + SUFFIX)]


def save_adapter(peft_model, out: Path, record: dict) -> None:
    """The adapter's weights in bfloat16 (half the size of peft's float32; merged they differ
    from the trained ones by bfloat16 rounding) and the training record beside them."""
    peft_model.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)  # peft's blank model card
    weights = out / "adapter_model.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(str(weights)).items()}, str(weights))
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def merge_adapter(hf_model, name: str, base_sha256: str | None):
    """(the base model with the adapter merged in, the tuned model's own digest: of the base
    weights' pinned hash and the adapter's files), refusing an adapter trained on other weights."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ModelError(f"{name!r} needs peft to merge its adapter: pip install 'dyncomplete[train]'") from None
    folder = adapter_dir(name)
    if not has_adapter(name):
        raise ModelError(f"no adapter for {name!r} in {folder}: run `dyncomplete train-lite --model {tuned_base(name)}`")
    record = json.loads((folder / RECORD).read_text())
    if base_sha256 and record.get("base_sha256") not in (None, base_sha256):
        raise ModelError(f"the adapter in {folder} was trained on other weights than {tuned_base(name)!r}")
    merged = PeftModel.from_pretrained(hf_model, str(folder)).merge_and_unload()
    return merged, tuned_digest(name, base_sha256)


def tuned_digest(name: str, base_sha256: str | None) -> str:
    """A tuned model's own digest: of its base weights' pinned hash and its adapter's files."""
    digest = hashlib.sha256((base_sha256 or "").encode())
    for path in sorted(adapter_dir(name).iterdir()):
        digest.update(f"{path.name}:{sha256_of(path)}".encode())
    return digest.hexdigest()
