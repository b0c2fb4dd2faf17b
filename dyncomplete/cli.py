"""The `dyncomplete` command. Each sub-command lives in its own module under
`dyncomplete/commands/` and exposes `register(subparsers)` (modules named `_*` are helpers);
this file only finds and runs them."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import __version__, commands
from .models import ModelError

# the optional modules, by the extra (pyproject.toml) that installs them
EXTRAS = {
    "matplotlib": "bench", "rapidfuzz": "bench", "rouge_score": "bench", "sacrebleu": "bench", "httpx": "bench",
    "gymnasium": "train", "stable_baselines3": "train", "peft": "train",
    "pynvml": "gpu", "llama_cpp": "reference", "ray": "cluster",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line error for a module that an extra installs, or None for any other."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return f"{module} is missing: install the {extra!r} extra (pip install 'dyncomplete[{extra}]')"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dyncomplete", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"dyncomplete {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args) or 0
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        print(f"dyncomplete: error: {message}", file=sys.stderr)
        return 2
    except (ModelError, ValueError, FileNotFoundError) as exc:
        print(f"dyncomplete: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dyncomplete: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
