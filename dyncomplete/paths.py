"""Where dyncomplete keeps files: the cache (converted weights, datasets, collected hidden states,
measurements of this machine filed under its CPU's identity) and the shipped assets (trained exit
heads, classifiers, agents)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Callable

ASSETS = Path(__file__).resolve().parent / "assets"


def cache_root() -> Path:
    return Path(os.environ.get("DYNCOMPLETE_CACHE", Path.home() / ".cache" / "dyncomplete"))


def cpu_name() -> str:
    """The CPU's model name, the readable part of `cpu_identity`."""
    return _cpu_fields().get("model name") or platform.processor() or platform.machine()


def cpu_identity() -> str:
    """What code compiled for this CPU (`-march=native`) and figures measured on it depend on: its
    model name, family, model and instruction-set flags. A name alone is not enough: virtual
    machines of AMD Zen 3 (AVX2) and Zen 4 (AVX-512) both call theirs "AMD EPYC", and a home
    directory may serve both."""
    fields = _cpu_fields()
    kind = (fields.get("cpu family"), fields.get("model"), sorted(_cpu_flags()))
    return f"{cpu_name()} [{hashlib.sha256(repr(kind).encode()).hexdigest()[:12]}]"


def machine_measurement(file: str, key: str, measure: Callable[[], float]) -> float:
    """A figure of this machine (e.g. copy bandwidth) under `key` in cache_root()/file, the CPU's
    identity prefixed: measured on first use, read back afterwards."""
    path = cache_root() / file
    key = f"{cpu_identity()}|{key}"
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key not in known:
        known[key] = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(known, indent=1) + "\n")
    return known[key]


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_fields() -> dict[str, str]:
    """/proc/cpuinfo's fields of the first CPU listed."""
    fields: dict[str, str] = {}
    for line in _cpuinfo().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_flags() -> set[str]:
    """The instruction-set flags of the first CPU listed."""
    return set(_cpu_fields().get("flags", "").split())


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bfloat16 natively (AVX512-BF16 or AMX)."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


def cpu_has_amx() -> bool:
    """Whether the CPU has AMX tiles for bfloat16 (Intel Sapphire Rapids and later)."""
    return "amx_bf16" in _cpu_flags()
