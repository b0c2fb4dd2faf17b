"""Deterministic file-level splits of a source tree (by default the CPython standard library).

Every command that trains on code (exit heads, classifiers, the RL agent) reads only the `train`
split; thresholds are calibrated on `calib`; benchmarks read `test`. A file belongs to exactly one
split, decided by a hash of its path relative to the root, so no file gives both training and
test examples and the split is the same on every machine with the same Python.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

SPLITS = {"train": (0, 70), "calib": (70, 80), "test": (80, 100)}  # percent ranges of the hash
EXTENSIONS = {"python": (".py",), "java": (".java",), "javascript": (".js",), "c": (".c", ".h"),
              "cpp": (".cc", ".cpp", ".hpp", ".h"), "go": (".go",), "rust": (".rs",)}
EXCLUDED_PARTS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3", "turtledemo"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> str:
    bucket = int(hashlib.sha256(relative_path.encode()).hexdigest(), 16) % 100
    for name, (lo, hi) in SPLITS.items():
        if lo <= bucket < hi:
            return name
    raise AssertionError(bucket)


def source_files(root: Path | None = None, lang: str = "python", split: str | None = None) -> list[Path]:
    """Sorted source files under `root` (tests excluded), optionally only those of one split."""
    root = Path(root) if root is not None else stdlib_root()
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use {', '.join(SPLITS)}")
    if lang not in EXTENSIONS:
        raise ValueError(f"unknown language {lang!r}: use {', '.join(EXTENSIONS)}")
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in EXTENSIONS[lang] or not path.is_file():
            continue
        if EXCLUDED_PARTS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        if split is None or split_of(rel.as_posix()) == split:
            files.append(path)
    return files
