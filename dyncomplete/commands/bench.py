"""`dyncomplete bench`: run decoding methods side by side on a dataset; write examples.jsonl,
summary.json, report.md and plots to --out (rerun the same command to resume)."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..data.datasets import NAMED
from ..methods import parse_method
from ..methods.registry import family_list
from ._common import add_model_options, load_from_args


def method_list(methods: str, sweeps: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Names from --methods (split on commas only) and --sweep FAMILY@T1,T2 (FAMILY = the text
    before the last '@'), baseline first and always; also each sweep's family -> its names."""
    names = ["baseline"] + [m.strip() for m in methods.split(",") if m.strip()]
    families: dict[str, list[str]] = {}
    for spec in sweeps:
        family, _, thresholds = spec.rpartition("@")
        values = [t.strip() for t in thresholds.split(",") if t.strip()]
        if not family or not values:
            raise ValueError(f"--sweep takes FAMILY@T1,T2,..., e.g. early-exit:confidence@0.5,0.7,0.9; got {spec!r}")
        families[family] = [f"{family}@{t}" for t in values]
        names += families[family]
    names = list(dict.fromkeys(names))
    for name in names:  # refuse a bad name before loading anything
        parse_method(name)
    return names, families


def run(args) -> int:
    from ..bench.bandwidth import machine_bandwidth
    from ..bench.plots import plot_drafting, plot_exit_energy, plot_sweeps, plot_tradeoff
    from ..data.datasets import load_dataset
    from ..paths import cpu_name
    from ..bench.report import render
    from ..bench.runner import Setup, run_bench
    from ..bench.summary import summarize

    if (args.actors != 1 or args.actor_cpus != 1) and not args.ray:
        raise ValueError("--actors and --actor-cpus need --ray ADDRESS")
    if args.actors < 1 or args.actor_cpus < 1:
        raise ValueError(f"--actors and --actor-cpus need at least 1, got {args.actors} and {args.actor_cpus}")
    names, sweeps = method_list(args.methods, args.sweep or [])
    dataset = load_dataset(args.dataset, args.limit)
    setup = Setup(args.context_budget, args.repo_context == "on", args.editor_guards == "on", args.cursor_line)
    loaded, produce = (ray_producer if args.ray else local_producer)(args, names, setup, dataset)
    out = Path(args.out)
    config = {"model": loaded["model"], "dataset": dataset.name, "dtype": loaded["dtype"], "quant": loaded["quant"],
              "device": args.device, "context_budget": args.context_budget, "repo_context": args.repo_context,
              "editor_guards": args.editor_guards, "cursor_line": args.cursor_line}
    records = run_bench(dataset, names, out, config, produce, progress=not args.no_progress)
    header = {**config, "command": shlex.join(["dyncomplete", *sys.argv[1:]]),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_name(),
              "threads": loaded["threads"], "memory_bandwidth_gbs": machine_bandwidth(),
              "energy_source": loaded["energy_source"], "energy_formula": loaded["energy_formula"],
              "dataset_notes": dataset.notes, "sweeps": sweeps}
    if args.ray:
        header["ray"] = {"address": args.ray, "actors": args.actors, "cpus_per_actor": args.actor_cpus}
    summary = summarize(records, names, header)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plots = [plot_tradeoff(summary, "decode_ms_per_token", out / "quality_vs_time.png").name,
             plot_tradeoff(summary, "energy_j_per_token", out / "quality_vs_energy.png").name]
    if sweeps:
        plots.append(plot_sweeps(summary, sweeps, out / "sweep.png").name)
    for extra in (plot_drafting(summary, out / "drafting.png"), plot_exit_energy([summary], out / "exit_energy.png")):
        if extra is not None:
            plots.append(extra.name)
    report = render(summary, plots)
    (out / "report.md").write_text(report)
    print(json.dumps(summary, indent=2) if args.json else report)
    print(f"dyncomplete: results in {out}/", file=sys.stderr)
    return 0


def local_producer(args, names, setup, dataset):
    """The model loaded here, and `run_bench`'s producer on it."""
    from ..bench.runner import Runner, local_records
    from ..energy import open_meter

    runner = Runner(load_from_args(args), names, open_meter(args.device), setup)
    return runner.describe(), lambda pending: local_records(runner, pending, dataset)


def ray_producer(args, names, setup, dataset):
    """--actors copies of the model on the Ray cluster, and `run_bench`'s producer on them."""
    from ..bench.cluster import ray_records, start_actors

    model_options = {"name": args.model, "dtype": args.dtype, "device": args.device, "quant": args.quant}
    actors, loaded = start_actors(args.ray, args.actors, args.actor_cpus, model_options, names, setup)
    return loaded, ray_records(actors, dataset)


def register(sub) -> None:
    p = sub.add_parser("bench", help="compare decoding methods on a dataset (quality, speed, energy)")
    add_model_options(p)
    p.add_argument("--dataset", required=True,
                   help=f"{', '.join(NAMED)}, or a CodeXGLUE-style .jsonl file")
    p.add_argument("--methods", default="baseline",
                   help="comma-separated method names, e.g. baseline,hf-generate (baseline is always run); "
                        f"families {family_list()}")
    p.add_argument("--sweep", action="append", metavar="FAMILY@T1,T2,...",
                   help="add FAMILY@T for each threshold and plot the family as a curve (repeatable)")
    p.add_argument("--limit", type=int, default=None, help="first N examples (line-py, line-java: default 200)")
    p.add_argument("--out", required=True, help="folder for the results; an existing run there is resumed")
    p.add_argument("--context-budget", type=int, default=1024, help="prompt tokens kept")
    # the choices are prompts.CURSOR_LINES, not imported: the engine package imports torch, which --help need not
    p.add_argument("--cursor-line", default="middle", choices=["prefix", "middle"],
                   help="where a fill-in-the-middle prompt puts the cursor line's text: after the middle token, "
                        "as `serve` does (default), or in the prefix (runs before this option)")
    p.add_argument("--repo-context", default="on", choices=["on", "off"],
                   help="put an example's repository context (its 'extra' chunks, e.g. from `data cross-file`) "
                        "before its prompt")
    p.add_argument("--editor-guards", default="off", choices=["on", "off"],
                   help="end each completion where the server's editor guards would (single line when text "
                        "follows the cursor, a repeat of the suffix's first line, bracket balance)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="spread the examples over actors on the Ray cluster at ADDRESS, a model each (the "
                        "'cluster' extra); the records are a local run's, written in the order examples finish")
    p.add_argument("--actors", type=int, default=1, help="--ray: actors, each with its own copy of the model")
    p.add_argument("--actor-cpus", type=int, default=1, help="--ray: CPUs (and threads) each actor reserves")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
