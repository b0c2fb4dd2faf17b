"""Where dyncomplete keeps files: the cache (converted weights, datasets, collected hidden states)
and the shipped assets (trained exit heads, classifiers, agents)."""

from __future__ import annotations

import os
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"


def cache_root() -> Path:
    return Path(os.environ.get("DYNCOMPLETE_CACHE", Path.home() / ".cache" / "dyncomplete"))
