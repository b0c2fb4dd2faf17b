"""`dyncomplete plot-exits`: one early-exit energy/ROUGE-L figure over several bench runs (a tuned
model beside its base, say), each against its own baseline."""

from __future__ import annotations

import json
from pathlib import Path


def run(args) -> int:
    from ..bench.plots import plot_exit_energy

    summaries = []
    for run_dir in args.runs:
        path = Path(run_dir) / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"no bench summary at {path}: give `dyncomplete bench --out` directories")
        summaries.append(json.loads(path.read_text()))
    if plot_exit_energy(summaries, Path(args.out)) is None:
        raise ValueError("none of these runs has early-exit methods beside a baseline")
    print(args.out)
    return 0


def register(sub) -> None:
    p = sub.add_parser("plot-exits", help="early-exit energy saved against ROUGE-L change, several bench runs in one plot")
    p.add_argument("runs", nargs="+", help="bench output directories (each with summary.json)")
    p.add_argument("--out", required=True, help="PNG file")
    p.set_defaults(run=run)
