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
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (ModelError, ValueError, FileNotFoundError) as exc:
        print(f"dyncomplete: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dyncomplete: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
