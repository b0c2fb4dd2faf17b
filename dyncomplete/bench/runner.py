"""The benchmark loop: every method on every example, round-robin, results appended as they come.

Methods run one after the other on each example (A, B on example 1, then A, B on example 2) so
that a noisy machine's drift hits all of them alike. Before timing, each method completes a few
tokens once (warm-up: first-call allocations, lazy initialisation). Each result is one line of
`examples.jsonl`, written and flushed at once; a rerun with the same --out skips the (id, method)
pairs already there, so an interrupted run resumes where it stopped. On Ray (`cluster.py`),
examples are spread over actors, each running the same `Runner` on its own copy of the model:
the round-robin holds within each example, and the lines arrive in the order examples finish.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..data.datasets import Dataset, program
from ..engine import Stats, build_prompt
from ..engine.guards import EditorGuards
from ..engine.repo_context import RepoContext
from ..methods import make_method
from .execution import run_program, usable_bwrap
from .metrics import score

WARMUP_TOKENS = 4
EXAMPLES = "examples.jsonl"
RUN_FILE = "run.json"
PER_TOKEN_LISTS = ("token_layers", "token_sources")  # long, kept out of examples.jsonl


def read_results(out: Path) -> list[dict]:
    """Complete lines of examples.jsonl; a line cut off by an interruption is dropped from the file."""
    path = out / EXAMPLES
    if not path.is_file():
        return []
    records, lines = [], path.read_text(encoding="utf-8").splitlines()
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if len(records) != len([l for l in lines if l.strip()]):
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


RUN_DEFAULTS = {"quant": "none", "repo_context": "on", "editor_guards": "off",  # keys older run.json files lack
                "cursor_line": "prefix"}


def check_run(out: Path, config: dict) -> None:
    """Refuse to mix the results of a different model, dataset, dtype, weight format,
    repository-context, editor-guards or cursor-line setting into one folder (runs from before a
    key existed had its default)."""
    path = out / RUN_FILE
    if path.is_file():
        before = {**RUN_DEFAULTS, **json.loads(path.read_text())}
        for key in ("model", "dataset", "dtype", "quant", "repo_context", "editor_guards", "cursor_line"):
            now = config.get(key, RUN_DEFAULTS.get(key))
            if before.get(key) != now:
                raise ValueError(f"{out} holds a run with {key} {before.get(key)!r}, not {now!r}: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))


def evaluate(example: dict, prediction: str, has_tests: bool) -> dict:
    metrics = score(prediction, example["gt"])
    if has_tests:
        outcome = run_program(program(example, prediction))
        metrics["passed"] = outcome.passed
        metrics["test_status"] = outcome.status
    return metrics


def record_of(example, name, completion, prompt, measurement, model, has_tests, read_bytes: int) -> dict:
    stats: Stats = completion.stats
    s = stats.to_dict()
    for key in PER_TOKEN_LISTS:
        s.pop(key, None)
    return {
        "id": str(example["id"]),
        "method": name,
        "prediction": completion.text,
        "target": example["gt"],
        "metrics": evaluate(example, completion.text, has_tests),
        "stats": s,
        "compute_per_token": stats.summary(model)["compute_per_token"],
        "decision_per_token": stats.summary(model)["decision_per_token"],
        "weight_bytes": read_bytes,
        "energy_j": measurement.joules,
        "energy_source": measurement.source,
        "energy_formula": measurement.formula,
        "fim": prompt.fim,
        "prompt_truncated": prompt.truncated,
        "context_chunks": prompt.context_chunks,
    }


@dataclass(frozen=True)
class Setup:
    """How an example becomes a prompt and its generation parameters, the same locally and on Ray:
    `editor_guards` ends each completion where the server's guards for that cursor end it;
    `cursor_line` is where a FIM prompt puts the cursor line (prompts.CURSOR_LINES)."""
    context_budget: int = 1024
    repo_context: bool = True
    editor_guards: bool = False
    cursor_line: str = "middle"


class Runner:
    """The methods built on one model, with the bytes each one's step reads, run example by example."""

    def __init__(self, model, method_names: list[str], meter, setup: Setup):
        self.model, self.meter, self.setup = model, meter, setup
        self.methods = {name: make_method(name, model) for name in method_names}
        # weights one decode step reads; a reference engine with weights of its own says what it reads
        self.read_bytes = {name: m.weight_bytes() if hasattr(m, "weight_bytes") else model.weight_bytes_per_token()
                           for name, m in self.methods.items()}
        self.warm = False

    def describe(self) -> dict:
        """What was loaded and how it is measured: the run's config and header keys."""
        import torch

        return {"model": self.model.name, "dtype": str(self.model.dtype).removeprefix("torch."),
                "quant": self.model.quant, "threads": torch.get_num_threads(), "energy_source": self.meter.source,
                "energy_formula": self.meter.formula}

    def records(self, example: dict, names: list[str], dataset_params, has_tests: bool) -> Iterator[dict]:
        """Each named method on the example, in turn (warmed up before the first timed one)."""
        setup = self.setup
        prompt = prompt_of(self.model, example, setup.context_budget, setup.repo_context, setup.cursor_line)
        if not self.warm:
            warm = dataclasses.replace(dataset_params, max_new_tokens=min(WARMUP_TOKENS, dataset_params.max_new_tokens))
            for method in self.methods.values():
                method.generate(self.model, prompt.ids, warm)
            self.warm = True
        params = dataset_params
        if setup.editor_guards:
            params = dataclasses.replace(params, editor=EditorGuards.for_cursor(example["input"], example.get("suffix")))
        for name in names:
            with self.meter.measure() as m:
                completion = self.methods[name].generate(self.model, prompt.ids, params)
            yield record_of(example, name, completion, prompt, m, self.model, has_tests, self.read_bytes[name])


def pending_by_example(dataset: Dataset, method_names: list[str], out: Path) -> list[tuple[dict, list[str]]]:
    """The examples with the methods examples.jsonl lacks for them, in dataset order."""
    done = {(r["id"], r["method"]) for r in read_results(out)}
    pending = [(ex, [n for n in method_names if (str(ex["id"]), n) not in done]) for ex in dataset.examples]
    return [(ex, names) for ex, names in pending if names]


def local_records(runner: Runner, pending, dataset: Dataset) -> Iterator[dict]:
    for example, names in pending:
        yield from runner.records(example, names, dataset.params, dataset.has_tests)


def run_bench(dataset: Dataset, method_names: list[str], out: Path, config: dict, produce, progress: bool = True
              ) -> list[dict]:
    """Run what examples.jsonl lacks and return every result of these methods on these examples.
    `produce(pending)` yields the records of the pending (example, method names) pairs, in any
    order: `local_records` on this machine's model, or `bench.cluster.ray_records` on Ray actors."""
    out = Path(out)
    if dataset.has_tests:
        usable_bwrap()  # refuse before any generation, not at the first example's tests
    check_run(out, config)
    pending = pending_by_example(dataset, method_names, out)
    with open(out / EXAMPLES, "a", encoding="utf-8") as sink, \
            _progress(sum(len(names) for _, names in pending), progress) as bar:
        for record in produce(pending):
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            bar(f"{record['id']} {record['method']}")
    ids = {str(ex["id"]) for ex in dataset.examples}
    return [r for r in read_results(out) if r["id"] in ids and r["method"] in method_names]


def prompt_of(model, example: dict, context_budget: int, repo_context: bool, cursor_line: str = "middle"):
    """The example's prompt; with its repository context (`extra`) when it has one and
    `repo_context` is on."""
    context = None
    if repo_context and example.get("extra"):
        context = RepoContext.from_records(example["extra"], example.get("path", ""), example.get("repo", ""))
    return build_prompt(model.tokenizer, example["input"], example.get("suffix"), context_budget, context,
                        cursor_line=cursor_line)


class _progress:
    """A rich progress bar on stderr (or nothing); calling it advances by one."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled and total > 0

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.__enter__()
            self.task = self.bar.add_task("bench", total=self.total)
        return self

    def __call__(self, description: str) -> None:
        if self.enabled:
            self.bar.update(self.task, advance=1, description=description[-48:])

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
