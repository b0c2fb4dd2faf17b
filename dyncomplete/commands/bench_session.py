"""`dyncomplete bench-session`: replay typing real files through the HTTP server, prefix cache on
and off in one run, and report latency, time to first token, cache share and accepted lines."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from ._common import add_model_options


def default_sources(count: int) -> list[Path]:
    """The first `count` files of the standard library's test split with at least 200 lines."""
    from ..data.splits import source_files

    long = [p for p in source_files(split="test") if p.read_text(errors="replace").count("\n") >= 200]
    return long[:count]


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"editor session: {report['model']} / {report['method']}, {report['pauses']} pauses "
                        f"in {len(report['files'])} files")
    cols = [("p50 ms", "p50_ms", "{:.0f}"), ("p95 ms", "p95_ms", "{:.0f}"), ("TTFT p50", "ttft_p50_ms", "{:.0f}"),
            ("TTFT p95", "ttft_p95_ms", "{:.0f}"), ("prompt tok", "mean_prompt_tokens", "{:.0f}"),
            ("cached", "cached_prompt_share", "{:.1%}"), ("prefill ms", "mean_prefill_ms", "{:.0f}"),
            ("context", "mean_context_chunks", "{:.1f}"), ("decode ms/tok", "decode_ms_per_token", "{:.1f}"),
            ("drafts taken", "accepted_per_drafted", "{:.0%}"), ("accepted", "accepted_share", "{:.1%}"),
            ("ES", "es", "{:.1f}")]
    table.add_column("row", no_wrap=True)
    for name, _, _ in cols:
        table.add_column(name, justify="right")
    for row, stats in report["rows"].items():
        table.add_row(row, *(fmt.format(stats[key]) for _, key, fmt in cols))
    console = Console(width=max(Console().width, 130))
    console.print(table)
    console.print(f"p50 speedup from the cache: {report['p50_speedup']:.1f}x; identical completions cache on/off: "
                  f"{report['identical_completions']:.0%}")


def run(args) -> int:
    import signal

    import torch

    from ..bench.launch import running_server
    from ..paths import cpu_name

    # A terminated benchmark must still stop the server it started (the context manager's exit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from ..bench.session import pauses_of, replay

    sources = [Path(s) for s in args.source] if args.source else default_sources(args.files)
    pauses = [p for path in sources for p in pauses_of(path, args.start, args.lines)]
    if not pauses:
        raise ValueError("no non-blank lines to replay in the given files")

    def progress(done, total):
        print(f"\r{done}/{total} pauses", end="" if done < total else "\n", file=sys.stderr)

    def go(url, key):
        return replay(url, args.model, args.method, pauses, args.max_tokens, key, progress, args.token_healing == "on",
                      args.context_files, args.ngram_cache_row)

    if args.url:
        report = go(args.url.rstrip("/"), args.api_key)
    else:
        options = ["--method", args.method, "--methods", args.method, "--dtype", args.dtype, "--device", args.device,
                   "--quant", args.quant, "--context-budget", str(args.context_budget), "--log-level", "error"]
        with running_server(args.model, *options) as (url, _):
            report = go(url, None)
    report |= {"command": shlex.join(["dyncomplete", *sys.argv[1:]]), "cpu": cpu_name(),
               "threads": torch.get_num_threads(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench-session", help="replay typing files through the server: latency with/without prefix cache")
    add_model_options(p)
    p.add_argument("--method", default="baseline")
    p.add_argument("--source", nargs="+", help="files to type (default: --files files of the stdlib test split)")
    p.add_argument("--files", type=int, default=2, help="how many test-split files when --source is not given")
    p.add_argument("--lines", type=int, default=20, help="pauses (non-blank lines) replayed per file")
    p.add_argument("--start", type=float, default=0.5, help="where typing starts, as a fraction of the file")
    p.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each request (stop at end of line)")
    p.add_argument("--context-budget", type=int, default=1024, help="server's prompt budget in tokens")
    p.add_argument("--token-healing", default="on", choices=["on", "off"],
                   help="the server's token healing (off: for methods without it, such as llama-cpp)")
    p.add_argument("--context-files", type=int, default=0,
                   help="send each typed file's folder (up to this many other .py files) to the server first, "
                        "as an editor does, and use its memory of them; adds a no-context row")
    p.add_argument("--ngram-cache-row", action="store_true",
                   help="add a row without the server's cross-request n-gram cache (for n-gram drafting methods)")
    p.add_argument("--url", help="use this running server instead of starting one")
    p.add_argument("--api-key", help="with --url: the server's API key")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="also write the JSON report here")
    p.set_defaults(run=run)
