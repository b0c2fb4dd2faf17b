"""Weights cached in the format the engine reads: a model as `load` builds it for the fast engine
with int4 or int8 weights, saved once and memory-mapped at later loads.

Building that model from the converted float32 copy hashes the whole copy, rounds it to
bfloat16 and quantizes and packs every linear layer again, at every start. A snapshot holds the
result: the Hugging Face modules' dequantized bfloat16 weights (what prompts and the `hf` engine
multiply by) and decode.c's packed blocks. `torch.load(mmap=True, weights_only=True)` maps
them without running anything from the file, and the fast engine takes the blocks as they are.

A snapshot lives in `$DYNCOMPLETE_CACHE/packed/NAME-bfloat16-int4/` (or `-int8/`), with its source's config and
tokenizer files, in `SHARDS` files of about equal size (hashed in parallel), and carries the
digest of `integrity.py`, checked at every load: a damaged snapshot is refused, never served.
`snapshot.json` records what it was made from (the converted copy's digest record, a tuned
model's adapter, the code that quantizes and packs, transformers' version); a snapshot whose
sources changed is made again. Registered models and their tuned versions get snapshots; a
`.gguf` path or a local directory is loaded from its source each time.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from . import fast, native, weights
from .integrity import DIGEST_FILE, check_cached, record_digest
from .layered import LayeredModel
from .registry import REGISTRY, ModelError, cache_root, cached_dir, sha256_of
from .tuned import tuned_base, tuned_digest

FORMAT = 2  # bump when what a snapshot holds changes
SHARDS = 4
RECORD = "snapshot.json"
SOURCE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "special_tokens_map.json", "vocab.json", "merges.txt")


def _code_digest() -> str:
    """What the packed blocks depend on besides the weights: the functions that make them."""
    code = inspect.getsource(weights.quantize_levels) + inspect.getsource(native.pack_levels)
    return hashlib.sha256(code.encode()).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    name: str
    quant: str  # int4 or int8
    folder: Path
    source: Path  # the converted copy it is made from

    @staticmethod
    def for_load(name: str, dtype: torch.dtype, quant: str, engine: str, device: str) -> Snapshot | None:
        """The snapshot a `load` with these arguments would read or make; None where none applies
        (not int4/int8 in bfloat16 on the fast engine's CPU path, or not a registered model)."""
        base = tuned_base(name) or name
        if quant == "auto":
            quant = fast.default_quant("fast", torch.device(device), dtype)
        if base not in REGISTRY or quant not in weights.BITS or dtype != torch.bfloat16 or engine == "hf" \
                or device != "cpu":
            return None
        return Snapshot(name, quant, cache_root() / "packed" / f"{name}-bfloat16-{quant}", cached_dir(base))

    def provenance(self) -> dict | None:
        """What this snapshot must have been made from now; None while the converted copy is missing."""
        record = self.source / DIGEST_FILE
        if not record.is_file():
            return None
        import transformers

        base = tuned_base(self.name)
        return {"format": FORMAT, "code": _code_digest(), "transformers": transformers.__version__,
                "source_record": sha256_of(record),
                "adapter": tuned_digest(self.name, REGISTRY[base].sha256) if base else None}

    def current(self) -> bool:
        """Whether a snapshot was made from today's sources (its files are checked at `load`)."""
        try:
            made_from = json.loads((self.folder / RECORD).read_text())["provenance"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return made_from == self.provenance()

    def save(self, model: LayeredModel, progress=print) -> None:
        """Write `model` (as `load` built it: fast engine, this snapshot's format) as this snapshot, atomically."""
        provenance = self.provenance()
        if provenance is None or model.engine != "fast" or model.quant != self.quant:
            return
        progress(f"saving {self.name} as the engine reads it in {self.folder} (once) ...")
        tensors = {f"param.{k}": p.detach() for k, p in model.hf.named_parameters()}
        tensors |= {f"buffer.{k}": b for k, b in model.hf.named_buffers()}
        for key, lin in model.engines["fast"].linears().items():
            tensors[f"packed.{key}"] = lin.qweight
        tmp = None
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}.", dir=self.folder.parent))
            for i, shard in enumerate(_shards(tensors)):
                torch.save(shard, tmp / f"shard-{i}.pt")
            for file in SOURCE_FILES:
                if (self.source / file).is_file():
                    shutil.copy2(self.source / file, tmp / file)
            record = {"provenance": provenance, "source_sha256": model.source_sha256}
            (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
            record_digest(tmp, "blake3")
            if self.folder.exists():
                shutil.rmtree(self.folder)
            os.replace(tmp, self.folder)
        except OSError as exc:  # a full disk, or another process saving it at the same time
            if not self.current():
                progress(f"could not save the snapshot of {self.name} ({exc}); it loads from its source next time too")
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def load(self, progress=print) -> LayeredModel:
        """The model this snapshot holds, its files checked against their digest first."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        check_cached(self.folder, self.name, progress)
        tokenizer = AutoTokenizer.from_pretrained(self.folder)
        record = json.loads((self.folder / RECORD).read_text())
        tensors = {}
        for shard in sorted(self.folder.glob("shard-*.pt")):
            tensors |= torch.load(shard, mmap=True, weights_only=True)
        config = AutoConfig.from_pretrained(self.folder)
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        if (self.folder / "generation_config.json").is_file():
            hf.generation_config = GenerationConfig.from_pretrained(self.folder)
        _fill(hf, tensors, self.folder)
        packed = {key[len("packed."):]: t for key, t in tensors.items() if key.startswith("packed.")}
        return LayeredModel(hf, tokenizer, name=self.name, source_sha256=record["source_sha256"], engine="fast",
                            quant=self.quant, packed=packed)


def _shards(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """`tensors` in SHARDS dicts of about equal bytes; tensors that share memory (the fused
    weights' views, tied embeddings) stay in one, so each file holds that memory once."""
    groups: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        groups.setdefault(t.untyped_storage().data_ptr(), {})[key] = t
    shards = [({}, 0) for _ in range(SHARDS)]
    for group in sorted(groups.values(), key=lambda g: -next(iter(g.values())).untyped_storage().nbytes()):
        i = min(range(SHARDS), key=lambda s: shards[s][1])
        shards[i] = (shards[i][0] | group, shards[i][1] + next(iter(group.values())).untyped_storage().nbytes())
    return [shard for shard, _ in shards]


def _fill(hf: torch.nn.Module, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """Put the snapshot's tensors in place of a meta-device model's: each parameter once, in
    every module that shares it (tied embeddings), and every buffer."""
    owners: dict[int, list[str]] = {}
    for name, p in hf.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    params = dict(hf.named_parameters())
    missing = [n for n in params if f"param.{n}" not in tensors] + [
        n for n, _ in hf.named_buffers() if f"buffer.{n}" not in tensors]
    if missing:
        raise ModelError(f"the snapshot in {folder} lacks {missing[0]}: delete it and run again to remake it")
    for names in owners.values():
        first = next(n for n in names if n in params)
        shared = torch.nn.Parameter(tensors[f"param.{first}"], requires_grad=params[first].requires_grad)
        for name in names:
            module, _, leaf = name.rpartition(".")
            setattr(hf.get_submodule(module), leaf, shared)
    for name, _ in list(hf.named_buffers()):
        module, _, leaf = name.rpartition(".")
        setattr(hf.get_submodule(module), leaf, tensors[f"buffer.{name}"])
