"""Results tables in Markdown files, rendered from the runs that made them.

A table is a block in a Markdown file, its two marker lines at the start of a line:

    <!-- table bench results/speed-smollm2-135m-line-py results/qwen-line-py[baseline;lookup] columns=method,es,tok_s -->
    ...rendered lines...
    <!-- end table -->

`bench` reads each run folder's summary.json (`RUN[m1;m2]` keeps those methods, in that order);
`session` reads `bench-session` JSON reports (`FILE[row;row]` keeps those rows); `speed` reads
`bench.speed` outputs (`FILE[label]` names the build that ran, for the `build` column). Paths are
relative to the Markdown file. `render_file` rewrites every block from the runs; the text between
blocks is left alone. Above each table go the command, the machine and the date of every run in it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

BLOCK = re.compile(r"^(<!-- table (?P<spec>[^\n]+?) -->\n)(?P<body>.*?)^(<!-- end table -->)", re.S | re.M)
SOURCE = re.compile(r"^(?P<path>[^\[\]]+)(?:\[(?P<keep>[^\]]*)\])?$")


def _pct(v):
    return f"{100 * v:.0f}%"


def _fixed(digits):
    return lambda v: f"{v:.{digits}f}"


def _ratio(v):
    return f"{v:.2f}x"


def _round_ratios(run: dict) -> str | None:
    """The lowest and highest of a `bench.speed --rounds K` run's decode ratios to llama-bench."""
    if "rounds" not in run:
        return None
    ratios = [r["decode_tok_s"] / r["llama_bench"]["decode_tok_s"] for r in run["rounds"]]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def _signed_pct(v):
    return f"{100 * v:+.1f}%"


def _per_size(v):
    """{sequences in a batched call: ms} as "1: 22, 2: 35"."""
    return ", ".join(f"{k}: {ms:.0f}" for k, ms in sorted(v.items(), key=lambda kv: int(kv[0])))


def _vs_baseline(key):
    """The row's `key` relative to its run's baseline (None without one)."""
    def change(r):
        base = r["run"]["methods"].get("baseline")
        return r[key] / base[key] - 1 if base and base.get(key) else None
    return change


def _quality(m):
    if m.get("pass_at_1") is not None:
        return f"pass@1 {m['pass_at_1']:.1f}"
    return f"ES {m['es']:.1f}"


@dataclass(frozen=True)
class Column:
    title: str
    value: object  # a key of the row, or a function of the row
    fmt: object = str
    align: str = "---:"


# bench: a row is one method's entry of summary.json, plus the run header under "run"
BENCH_COLUMNS = {
    "run": Column("run", lambda r: r["folder"], align="---"),
    "model": Column("model", lambda r: r["run"]["model"], align="---"),
    "set": Column("set (n)", lambda r: f"{r['run']['dataset']} ({r['n']})", align="---"),
    "method": Column("method", lambda r: f"`{r['method']}`", align="---"),
    "quality": Column("quality", _quality),
    "es": Column("ES", "es", _fixed(1)),
    "em": Column("EM", "em", _fixed(1)),
    "rouge_l": Column("ROUGE-L", "rouge_l", _fixed(3)),
    "pass_at_1": Column("pass@1", "pass_at_1", _fixed(1)),
    "weights": Column("weights", lambda r: r["run"].get("quant") or "none", align="---"),
    "guards": Column("editor guards", lambda r: r["run"].get("editor_guards", "off"), align="---"),
    "new_tokens": Column("new tokens per completion", lambda r: r["new_tokens"] / r["n"], _fixed(1)),
    "tok_s": Column("decode tok/s", "tokens_per_s", _fixed(1)),
    "ms_token": Column("decode ms/token", "decode_ms_per_token", _fixed(1)),
    "compute": Column("compute per token", "compute_per_token", _fixed(2)),
    "prefill_tok_s": Column("prefill tok/s", "prefill_tokens_per_s", _fixed(0)),
    "x_baseline": Column("decode vs baseline", "speedup_vs_baseline", _ratio),
    "e2e_x_baseline": Column("end to end vs baseline", "e2e_speedup_vs_baseline", _ratio),
    "layers": Column("layers per token", "layer_evals_per_token", _fixed(1)),
    "energy": Column("J per token", "energy_j_per_token", _fixed(3)),
    "energy_vs_baseline": Column("energy vs baseline", _vs_baseline("energy_j_per_token"), _signed_pct),
    "completion_energy_vs_baseline": Column("energy per completion vs baseline", _vs_baseline("energy_j"), _signed_pct),
    "rouge_l_vs_baseline": Column("ROUGE-L vs baseline", _vs_baseline("rouge_l"), _signed_pct),
    "same": Column("same as baseline", "identical_to_baseline", _pct),
    "bandwidth": Column("bandwidth", "bandwidth_share", _pct),
    "acceptance": Column("drafts accepted", "acceptance_rate", _pct),
    "accepted_length": Column("tokens per verification", "mean_accepted_length", _fixed(2)),
}
BENCH_DEFAULT = ("model", "set", "method", "quality", "tok_s", "x_baseline", "same")

# session: a row is one row of a bench-session report, plus the report under "run"
SESSION_COLUMNS = {
    "model": Column("model", lambda r: r["run"]["model"], align="---"),
    "method": Column("method", lambda r: f"`{r['run']['method']}`", align="---"),
    "row": Column("row", lambda r: r["row"], align="---"),
    "n": Column("requests", "requests"),
    "p50": Column("p50 ms", "p50_ms", _fixed(0)),
    "p95": Column("p95 ms", "p95_ms", _fixed(0)),
    "ttft_p50": Column("first token p50 ms", "ttft_p50_ms", _fixed(0)),
    "ttft_p95": Column("first token p95 ms", "ttft_p95_ms", _fixed(0)),
    "cached": Column("prompt cached", "cached_prompt_share", _pct),
    "prompt_tokens": Column("prompt tokens", "mean_prompt_tokens", _fixed(0)),
    "decode_ms": Column("decode ms/token", "decode_ms_per_token", _fixed(1)),
    "exact": Column("lines exact", lambda r: f"{r['accepted']} of {r['requests'] - r.get('after_accept', 0)}"),
    "es": Column("ES", "es", _fixed(1)),
    "chunks": Column("context chunks", "mean_context_chunks", _fixed(1)),
    "client": Column("client", lambda r: r["run"].get("client"), align="---"),
    "pattern": Column("pattern", lambda r: r["run"].get("pattern"), align="---"),
    "prompt_evaluated": Column("prompt tokens evaluated", "prompt_tokens_evaluated", _fixed(0)),
    "prompt_reused": Column("prompt tokens reused", "prompt_tokens_reused", _fixed(0)),
    "generated": Column("tokens generated", "tokens_generated", _fixed(0)),
    "lines": Column("lines suggested", "lines_suggested", _fixed(0)),
    "lines_right": Column("lines right per suggestion", "lines_right", _fixed(2)),
    "same_as_first": Column("same as first row", "same_as_first_row", _pct),
    "from_cache": Column("shown from llama.vim's cache", "from_client_cache", _pct),
    "p50_asked": Column("p50 ms of those asked", "p50_asked_ms", _fixed(0)),
    "background": Column("background ms per pause", "background_ms", _fixed(0)),
    "waited_p50": Column("p50 ms from pause to suggestion", "waited_p50_ms", _fixed(0)),
    "waited_p95": Column("p95 ms from pause to suggestion", "waited_p95_ms", _fixed(0)),
    "held_back": Column("pauses behind their editor's background requests", "held_back_share", _pct),
    "editors": Column("editors at once", lambda r: r.get("editors", r["run"].get("editors", 1))),
    "think": Column("typing ms between pauses (mean)", lambda r: r["run"].get("think_ms", 0)),
    "keystroke": Column("ms between keystrokes (mean)", lambda r: r["run"].get("keystroke_ms", 0)),
    "requests_per_pause": Column("requests per pause", lambda r: 1 - r["from_client_cache"] + r["background_requests"]
                                 if "background_requests" in r else None, _fixed(1)),
    "per_s": Column("completions per s", "completions_per_s", _fixed(2)),
    "batch_p50": Column("sequences per batched call (median)", "batch_p50", _fixed(0)),
    "batch_ms": Column("ms a batched call, by its sequences", "batch_ms", _per_size, align="---"),
    "model_busy": Column("model thread busy", "model_busy_share", _pct),
    "tokens_per_s": Column("tokens generated per s", "tokens_per_s", _fixed(1)),
    "drafted": Column("drafted rows handed in", "drafted_rows"),
    "drafted_cut": Column("of those, cut by the shared budget", "drafted_rows_cut"),
    "cache_hits": Column("prefix-cache hits", "prefix_cache_hit_share", _pct),
    "prompt_from_cache": Column("prompt tokens from a cache", "prompt_reused_share", _pct),
    "results": Column("results file", lambda r: f"`{r['file']}`", align="---"),
    "home": Column("pauses on the editor's main replica", "home_replica_share", _pct),
    "replicas": Column("replicas that answered", "replicas"),
    "reused": Column("answered from kept answers", "reused_share", _pct),
    "server_reused": Column("requests answered from kept answers", "server_reused_share", _pct),
    "taken": Column("asked after a suggestion was taken", "after_accept"),
    "taken_p50": Column("p50 ms of those", "after_accept_p50_ms", _fixed(0)),
    "prefetch_hits": Column("of those, from the prefetch", "prefetch_hits", _pct),
}
SESSION_DEFAULT = ("model", "method", "row", "n", "p50", "p95", "ttft_p50", "cached", "exact")

SPEED_COLUMNS = {  # one `python -m dyncomplete.bench.speed --reference llama-bench` output a row
    "build": Column("build", "build", str, align="---"),  # FILE[label]: which code ran (A/B rows)
    "model": Column("model", "model", str, align="---"),
    "quant": Column("weights", "quant", str, align="---"),
    "dtype": Column("dtype", "dtype", str, align="---"),
    "cpu_bf16": Column("CPU has bf16 instructions", "cpu_bf16", lambda v: "yes" if v else "no", align="---"),
    "decode": Column("decode tok/s", "decode_tok_s", _fixed(1)),
    "bandwidth": Column("share of copy bandwidth", "bandwidth_share", _pct),
    "read": Column("share of read bandwidth", "read_share", _pct),
    "llama_decode": Column("llama-bench decode tok/s", lambda r: r["llama_bench"]["decode_tok_s"], _fixed(1)),
    "decode_x": Column("decode vs llama-bench", lambda r: r["llama_bench"]["decode_x"], _ratio),
    "rounds": Column("rounds", lambda r: r["llama_bench"].get("rounds", 1), str),
    "decode_x_range": Column("decode vs llama-bench, range of the rounds", _round_ratios, str),
    "prefill": Column("prefill tok/s", "prefill_tok_s", _fixed(0)),
    "llama_prefill": Column("llama-bench prefill tok/s", lambda r: r["llama_bench"]["prefill_tok_s"], _fixed(0)),
    "prefill_x": Column("prefill vs llama-bench", lambda r: r["llama_bench"]["prefill_x"], _ratio),
    "load": Column("load s", "load_s", _fixed(1)),
}
SPEED_DEFAULT = tuple(c for c in SPEED_COLUMNS if c not in ("build", "dtype", "cpu_bf16", "read", "rounds",
                                                             "decode_x_range"))


def _cell(column: Column, row: dict) -> str:
    value = column.value(row) if callable(column.value) else row.get(column.value)
    return "–" if value is None else column.fmt(value)


def _table(columns: list[Column], rows: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(c.title for c in columns) + " |",
             "|" + "|".join(c.align for c in columns) + "|"]
    lines += ["| " + " | ".join(_cell(c, r) for c in columns) + " |" for r in rows]
    return lines


def bench_command(run: dict, methods: list[str]) -> str:
    """The recorded command, or for runs that predate recording, one rebuilt from their settings."""
    if run.get("command"):
        return run["command"]
    parts = ["dyncomplete", "bench", "--model", run["model"], "--dataset", run["dataset"], "--limit", str(run["n"])]
    for key, flag, default in (("quant", "--quant", "none"), ("context_budget", "--context-budget", 1024),
                               ("repo_context", "--repo-context", "on"), ("editor_guards", "--editor-guards", "off")):
        if run.get(key) not in (None, default):
            parts += [flag, str(run[key])]
    return shlex.join(parts + ["--methods", ",".join(methods)])


def session_command(report: dict) -> str:
    if report.get("command"):
        return report["command"]
    parts = ["dyncomplete", "bench-session", "--client", report.get("client", "line"), "--model", report["model"],
             "--method", report["method"], "--lines", str(report["pauses"] // len(report["files"]))]
    if report.get("context_files"):
        parts += ["--context-files", str(report["context_files"])]
    if not report.get("token_healing", True):
        parts += ["--token-healing", "off"]
    return shlex.join(parts) + "` typing `" + ", ".join(Path(f).name for f in report["files"])


def _provenance(command: str, run: dict, recorded: bool) -> str:
    machine = f"{run['cpu']}, {run['threads']} threads" if run.get("cpu") else "machine not recorded"
    date = run.get("date") or "date not recorded"
    label = "" if recorded else " (rebuilt from the run's settings)"
    return f"- `{command}`{label}: {machine}, {date}"


def _sources(spec: list[str], base: Path):
    for token in spec:
        match = SOURCE.match(token)
        if not match:
            raise ValueError(f"table source {token!r}: expected PATH or PATH[a;b]")
        keep = [k for k in (match["keep"] or "").split(";") if k]
        yield base / match["path"], keep


def render_bench(sources, column_names) -> list[str]:
    rows, notes = [], []
    for folder, keep in sources:
        run = json.loads((folder / "summary.json").read_text())
        methods = keep or list(run["methods"])
        unknown = [m for m in methods if m not in run["methods"]]
        if unknown:
            raise ValueError(f"{folder}: no method {', '.join(unknown)} in summary.json")
        notes.append(_provenance(bench_command(run, list(run["methods"])), run, bool(run.get("command"))))
        rows += [{**run["methods"][m], "method": m, "run": run, "folder": folder.name} for m in methods]
    columns = [BENCH_COLUMNS[c] for c in column_names or BENCH_DEFAULT]
    return notes + [""] + _table(columns, rows)


def render_session(sources, column_names) -> list[str]:
    rows, notes = [], []
    for path, keep in sources:
        report = json.loads(path.read_text())
        names = keep or list(report["rows"])
        unknown = [n for n in names if n not in report["rows"]]
        if unknown:
            raise ValueError(f"{path}: no row {', '.join(unknown)}")
        notes.append(_provenance(session_command(report), report, bool(report.get("command"))))
        rows += [{**report["rows"][n], "row": n, "run": report, "file": path.name} for n in names]
    columns = [SESSION_COLUMNS[c] for c in column_names or SESSION_DEFAULT]
    return notes + [""] + _table(columns, rows)


def render_speed(sources, column_names) -> list[str]:
    runs = [json.loads(path.read_text()) | ({"build": keep[0]} if keep else {}) for path, keep in sources]
    notes = [_provenance(run["command"], run, True) for run in runs]
    columns = [SPEED_COLUMNS[c] for c in column_names or SPEED_DEFAULT]
    return notes + [""] + _table(columns, runs)


KINDS = {"bench": (render_bench, BENCH_COLUMNS), "session": (render_session, SESSION_COLUMNS),
         "speed": (render_speed, SPEED_COLUMNS)}


def render_block(spec: str, base: Path) -> str:
    words = shlex.split(spec)
    kind, rest = words[0], words[1:]
    if kind not in KINDS:
        raise ValueError(f"table kind {kind!r}: use {', '.join(KINDS)}")
    render, known = KINDS[kind]
    columns = [c for w in rest if w.startswith("columns=") for c in w.removeprefix("columns=").split(",")]
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ValueError(f"{kind} table: unknown column {', '.join(unknown)}; known: {', '.join(known)}")
    lines = render(list(_sources([w for w in rest if not w.startswith("columns=")], base)), columns)
    return "\n".join(lines) + "\n"


def render_text(text: str, base: Path) -> str:
    """ValueError where a table's start has no end before the next start: rendering it would
    replace the text up to a later table's end."""
    for m in BLOCK.finditer(text):
        if "<!-- table " in m["body"]:
            line = text.count("\n", 0, m.start()) + 1
            raise ValueError(f"the table at line {line} has no '<!-- end table -->' before the next table")
    return BLOCK.sub(lambda m: m.group(1) + render_block(m["spec"], base) + m.group(4), text)


def render_file(path: Path) -> bool:
    """Rewrite the file's tables from their runs; True when something changed."""
    text = path.read_text()
    new = render_text(text, path.parent)
    if new != text:
        path.write_text(new)
    return new != text


def stale_files(paths: list[Path]) -> list[Path]:
    """The files whose tables differ from what their runs render."""
    return [p for p in paths if render_text(p.read_text(), p.parent) != p.read_text()]
