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
    weights' pinned hash and the adapter's files), refusing an adapter trained on other weights.
    Needs no peft: serving a tuned model is `merge_lora`'s few products."""
    folder = adapter_dir(name)
    if not has_adapter(name):
        raise ModelError(f"no adapter for {name!r} in {folder}: run `dyncomplete train-lite --model {tuned_base(name)}`")
    record = json.loads((folder / RECORD).read_text())
    if base_sha256 and record.get("base_sha256") not in (None, base_sha256):
        raise ModelError(f"the adapter in {folder} was trained on other weights than {tuned_base(name)!r}")
    config = json.loads((folder / "adapter_config.json").read_text())
    merge_lora(hf_model, load_file(str(folder / "adapter_model.safetensors")), config)
    return hf_model, tuned_digest(name, base_sha256)


LORA_PREFIX = "base_model.model."  # peft's names of the wrapped model's modules


def merge_lora(hf_model, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """Add each LoRA pair's product B @ A x alpha / r to its linear layer's weight, in place, as
    peft's `merge_and_unload` does it (the product in float32, added into the weight's dtype): the
    same bits. Plain LoRA only, the kind `train-lite` saves."""
    unsupported = [k for k in ("use_dora", "use_rslora", "fan_in_fan_out", "rank_pattern", "alpha_pattern")
                   if config.get(k)]
    unsupported += [k for k in tensors if not k.endswith((".lora_A.weight", ".lora_B.weight"))]
    if config.get("peft_type") != "LORA" or unsupported or config.get("bias", "none") != "none":
        raise ModelError(f"the adapter is not a plain LoRA adapter ({', '.join(unsupported) or config.get('peft_type')})")
    scaling = config["lora_alpha"] / config["r"]
    modules = dict(hf_model.named_modules())
    for key in sorted(k for k in tensors if k.endswith(".lora_A.weight")):
        module, pair = key.removeprefix(LORA_PREFIX).removesuffix(".lora_A.weight"), key.replace(".lora_A.", ".lora_B.")
        if pair not in tensors:
            raise ModelError(f"the adapter has no lora_B for {module}")
        if module not in modules:
            raise ModelError(f"the adapter names a module the model lacks: {module}")
        a, b = tensors[key].float(), tensors[pair].float()
        with torch.no_grad():
            modules[module].weight += (b @ a) * scaling


def tuned_digest(name: str, base_sha256: str | None) -> str:
    """A tuned model's own digest: of its base weights' pinned hash and its adapter's files."""
    digest = hashlib.sha256((base_sha256 or "").encode())
    for path in sorted(adapter_dir(name).iterdir()):
        digest.update(f"{path.name}:{sha256_of(path)}".encode())
    return digest.hexdigest()
