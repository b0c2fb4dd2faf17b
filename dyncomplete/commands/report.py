"""`dyncomplete report`: render the results tables of Markdown files from the runs they name
(see bench/doc_tables.py); `--check` only says which files differ."""

from __future__ import annotations

import sys
from pathlib import Path


def markdown_files(paths: list[str]) -> list[Path]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.md"))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p} does not exist")
    return files


def run(args) -> int:
    from ..bench.doc_tables import render_file, stale_files

    files = markdown_files(args.paths)
    if args.check:
        stale = stale_files(files)
        for p in stale:
            print(f"{p}: tables differ from their runs; run `dyncomplete report {p}`", file=sys.stderr)
        return 1 if stale else 0
    for p in files:
        if render_file(p):
            print(f"rendered {p}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="render the results tables in Markdown files from the runs they name")
    p.add_argument("paths", nargs="+", help="Markdown files or folders (every *.md below them)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its runs")
    p.set_defaults(run=run)
