"""`dyncomplete bench-session`: replay typing real files through a server as an editor plugin does
(llama.vim, llama.vscode, Continue; against dyncomplete and llama-server), or prefix-only
/v1/completions requests with the prefix cache on and off (`--client line`), and report latency,
time to first token, prompt tokens evaluated and reused, and accepted lines."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from ._common import EDITOR_METHOD, add_model_options, out_file, positive

SERVERS = ("dyncomplete", "llama-server")
# bench.session's CLIENTS and PATTERNS, named here so that registering the command imports nothing heavy
CLIENT_NAMES = ("llama-vim", "llama-vscode", "continue", "line")  # line: the prefix-only /v1/completions replay
PATTERN_NAMES = ("down", "within")

LINE_COLUMNS = [("p50 ms", "p50_ms", "{:.0f}"), ("p95 ms", "p95_ms", "{:.0f}"), ("TTFT p50", "ttft_p50_ms", "{:.0f}"),
                ("TTFT p95", "ttft_p95_ms", "{:.0f}"), ("prompt tok", "mean_prompt_tokens", "{:.0f}"),
                ("cached", "cached_prompt_share", "{:.1%}"), ("prefill ms", "mean_prefill_ms", "{:.0f}"),
                ("context", "mean_context_chunks", "{:.1f}"), ("decode ms/tok", "decode_ms_per_token", "{:.1f}"),
                ("drafts taken", "accepted_per_drafted", "{:.0%}"), ("accepted", "accepted_share", "{:.1%}"),
                ("ES", "es", "{:.1f}")]
EDITOR_COLUMNS = [("p50 ms", "p50_ms", "{:.0f}"), ("p95 ms", "p95_ms", "{:.0f}"), ("TTFT p50", "ttft_p50_ms", "{:.0f}"),
                  ("completions/s", "completions_per_s", "{:.2f}"), ("batch p50", "batch_p50", "{:.0f}"),
                  ("cache hits", "prefix_cache_hit_share", "{:.0%}"),
                  ("prompt from cache", "prompt_reused_share", "{:.0%}"),
                  ("from cache", "from_client_cache", "{:.0%}"), ("p50 asked", "p50_asked_ms", "{:.0f}"),
                  ("background ms", "background_ms", "{:.0f}"),
                  ("pause to answer p50", "waited_p50_ms", "{:.0f}"), ("pause to answer p95", "waited_p95_ms", "{:.0f}"),
                  ("behind own background", "held_back_share", "{:.0%}"), ("server reused", "reused_share", "{:.0%}"),
                  ("after taking", "after_accept", "{:.0f}"), ("p50 after taking", "after_accept_p50_ms", "{:.0f}"),
                  ("prefetch hits", "prefetch_hits", "{:.0%}"),
                  ("prompt tok evaluated", "prompt_tokens_evaluated", "{:.0f}"),
                  ("prompt tok reused", "prompt_tokens_reused", "{:.0f}"),
                  ("tok generated", "tokens_generated", "{:.0f}"), ("lines", "lines_suggested", "{:.0f}"),
                  ("lines right", "lines_right", "{:.2f}"), ("accepted", "accepted_share", "{:.1%}"),
                  ("ES", "es", "{:.1f}")]


def default_sources(count: int) -> list[Path]:
    """The first `count` files of the standard library's test split with at least 200 lines."""
    from ..data.splits import source_files

    long = [p for p in source_files(split="test") if p.read_text(errors="replace").count("\n") >= 200]
    return long[:count]


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    line = report["client"] == "line"
    cols = LINE_COLUMNS if line else EDITOR_COLUMNS
    table = Table(title=f"editor session: {report['model']} / {report['method']}, {report['client']} "
                        f"({report['pattern']}), {report['pauses']} pauses in {len(report['files'])} files")
    table.add_column("row", no_wrap=True)
    for name, _, _ in cols:
        table.add_column(name, justify="right")
    for row, stats in report["rows"].items():
        table.add_row(row, *("–" if stats.get(key) is None else fmt.format(stats[key]) for _, key, fmt in cols))
    console = Console(width=max(Console().width, 130))
    console.print(table)
    if line:
        console.print(f"p50 speedup from the cache: {report['p50_speedup']:.1f}x; identical completions cache "
                      f"on/off: {report['identical_completions']:.0%}")
    else:
        if any(stats["ttft_p50_ms"] is None for stats in report["rows"].values()):
            console.print("TTFT –: the client does not stream, so the first token is not seen before the whole answer")
        if report["client"] == "llama-vim":
            console.print("llama.vim shows a suggestion from its own cache where the typing continues one "
                          "(0 ms, counted in p50 and p95); p50 asked: the pauses it sent a request for; background: "
                          "its speculative requests after each pause; pause to answer: from the pause to its "
                          "suggestion, with the time its request waited for the editor's own background requests "
                          "(llama.vim sends none while one runs; with --think-ms only)")
        if report.get("keystroke_ms"):
            console.print("--keystroke-ms: llama.vim asked at the typed characters too; every latency counts from "
                          "the pause's last keystroke; background: the requests sent since the pause before")


def progress(done: int, total: int) -> None:
    print(f"\r{done}/{total} pauses", end="" if done < total else "\n", file=sys.stderr)


def dyncomplete_options(args) -> list[str]:
    return ["--method", args.method, "--methods", args.method, "--dtype", args.dtype, "--device", args.device,
            "--quant", args.quant, "--context-budget", str(args.context_budget), "--log-level", "error"]


def line_report(args, sources: list[Path]) -> dict:
    """`--client line`: the prefix-only /v1/completions replay against dyncomplete, its rows the server's caches."""
    from ..bench.launch import running_server
    from ..bench.session import pauses_of, replay

    if args.server != ["dyncomplete"] or args.pattern != "down":
        raise ValueError("--client line types line starts (--pattern down) against dyncomplete only "
                         "(--server dyncomplete): its rows switch dyncomplete's caches")
    pauses = [p for path in sources for p in pauses_of(path, args.start, args.lines)]
    if not pauses:
        raise ValueError("no non-blank lines to replay in the given files")

    def go(url, key):
        return replay(url, args.model, args.method, pauses, args.max_tokens, key, progress, args.token_healing == "on",
                      args.context_files, args.ngram_cache_row)

    if args.url:
        return go(args.url.rstrip("/"), args.api_key) | {"client": "line", "pattern": "line start"}
    with running_server(args.model, *dyncomplete_options(args)) as (url, _):
        return go(url, None) | {"client": "line", "pattern": "line start"}


def dyncomplete_rows(args) -> dict:
    """One row per --dyncomplete-args (none: one row with the server's defaults)."""
    from ..bench.launch import running_server

    return {f"dyncomplete {extra}".strip(): partial(running_server, args.model, *dyncomplete_options(args),
                                                    *shlex.split(extra))
            for extra in args.dyncomplete_args or [""]}


def llama_server_rows(args) -> dict:
    """One row per --server-args (none: one row with llama-server's defaults), on the model's own GGUF file."""
    from ..bench.launch import running_llama_server
    from ..models.loading import registered_gguf

    gguf = registered_gguf(args.model, progress=lambda m: print(m, file=sys.stderr))
    return {f"llama-server {extra}".strip(): partial(running_llama_server, gguf, *shlex.split(extra))
            for extra in args.server_args or [""]}


SERVER_ROWS = {"dyncomplete": dyncomplete_rows, "llama-server": llama_server_rows}


def editor_report(args, sources: list[Path]) -> dict:
    """The editor replay, one row per server started and number of editors (in turn, each server
    stopped before the next, so that no row finds another's prompts or answers kept)."""
    from ..bench.session import CLIENTS, cursors_of, replay_editors, summarise_editor

    if args.client == "continue" and "llama-server" in args.server:
        raise ValueError("--client continue posts Ollama's /api/generate, which llama-server does not serve")
    if args.server_args and "llama-server" not in args.server:
        raise ValueError("--server-args are llama-server's: add --server llama-server")
    if args.dyncomplete_args and "dyncomplete" not in args.server:
        raise ValueError("--dyncomplete-args are dyncomplete's: add --server dyncomplete")
    if args.url and len(args.concurrent) > 1:
        raise ValueError("several --concurrent values start a server for each; give one with --url")
    cursors = [c for path in sources for c in cursors_of(path, args.pattern, args.start, args.lines)]
    if not cursors:
        raise ValueError("no non-blank lines to replay in the given files")

    texts = {}  # row -> its completions, to compare each row's with the first row's

    def go(name, url, headers, editors):
        results, served = replay_editors(url, args.model, args.client, cursors, args.n_predict, headers,
                                         editors, accept_ms=args.accept_ms, think_ms=args.think_ms,
                                         keystroke_ms=args.keystroke_ms)
        # by cursor, not by editor and pause: rows with other editor counts share the pauses out apart
        texts[name] = {r["where"]: r["text"] for r in results if not r["after_accept"]}
        first = next(iter(texts.values()))
        both = texts[name].keys() & first.keys()  # a taken suggestion skips its line's later pauses
        return summarise_editor(results) | served | {
            "editors": editors, "same_as_first_row": sum(texts[name][k] == first[k] for k in both) / len(both)}

    def row_name(server: str, editors: int) -> str:
        return server if len(args.concurrent) == 1 else f"{server}, {editors} editor{'s' * (editors > 1)}"

    if args.url:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        rows = {args.url: go(args.url, args.url.rstrip("/"), headers, args.concurrent[0])}
    else:
        starters = {name: start for server in args.server for name, start in SERVER_ROWS[server](args).items()}
        rows = {}
        for name, start in starters.items():
            for editors in args.concurrent:
                row = row_name(name, editors)
                with start() as (url, _):
                    rows[row] = go(row, url, {}, editors)
    counts = args.concurrent[0] if len(args.concurrent) == 1 else args.concurrent
    return {"model": args.model, "method": args.method, "client": args.client, "pattern": args.pattern,
            "route": CLIENTS[args.client].route, "n_predict": args.n_predict, "editors": counts,
            "accept_ms": args.accept_ms, "think_ms": args.think_ms, "keystroke_ms": args.keystroke_ms,
            "files": sorted({c.file for c in cursors}), "pauses": len(cursors), "rows": rows}


def run(args) -> int:
    import signal

    import torch

    from ..bench.session import check_keystrokes
    from ..paths import cpu_name

    check_keystrokes(args.client, args.keystroke_ms, args.accept_ms, args.think_ms)  # --client line too
    # A terminated benchmark must still stop the servers it started (the context managers' exits).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = out_file(args.out)
    sources = [Path(s) for s in args.source] if args.source else default_sources(args.files)
    report = (line_report if args.client == "line" else editor_report)(args, sources)
    report |= {"command": shlex.join(["dyncomplete", *sys.argv[1:]]), "cpu": cpu_name(),
               "threads": torch.get_num_threads(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if out:
        out.write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench-session", help="replay typing files through servers as editor plugins do")
    add_model_options(p)
    p.add_argument("--client", default="llama-vim", choices=CLIENT_NAMES,
                   help="whose requests to replay: llama-vim, llama-vscode (/infill), continue (/api/generate), "
                        "or line (prefix-only /v1/completions, prefix cache on and off)")
    p.add_argument("--pattern", default="down", choices=PATTERN_NAMES,
                   help="down: a pause per line, the cursor after the indentation; within: also a third and "
                        "two thirds into the line (not with --client line)")
    p.add_argument("--server", nargs="+", default=["dyncomplete"], choices=SERVERS,
                   help="servers to start in turn, a row each (llama-server: built by install-reference.sh)")
    p.add_argument("--server-args", action="append",
                   help="llama-server's extra arguments, e.g. \"--spec-type ngram-mod\"; repeat for a row each")
    p.add_argument("--dyncomplete-args", action="append",
                   help="dyncomplete serve's extra arguments, e.g. \"--cache-reuse 32\" or \"--cache-mb 0\" (full "
                        "prefills); repeat for a row each")
    p.add_argument("--method", default=EDITOR_METHOD, help="dyncomplete's method (default: serve's)")
    p.add_argument("--source", nargs="+", help="files to type (default: --files files of the stdlib test split)")
    p.add_argument("--files", type=int, default=2, help="how many test-split files when --source is not given")
    p.add_argument("--lines", type=int, default=20, help="non-blank lines typed per file")
    p.add_argument("--start", type=float, default=0.5, help="where typing starts, as a fraction of the file")
    p.add_argument("--n-predict", type=int, default=128,
                   help="the editor clients' n_predict (Continue: options.num_predict); llama.vim's own is 128")
    p.add_argument("--max-tokens", type=int, default=24, help="--client line: max_tokens (stop at end of line)")
    p.add_argument("--context-budget", type=int, default=1024, help="dyncomplete's prompt budget in tokens")
    p.add_argument("--token-healing", default="on", choices=["on", "off"],
                   help="--client line: the server's token healing (off: for methods without it, such as llama-cpp)")
    p.add_argument("--context-files", type=int, default=0,
                   help="--client line: send each typed file's folder (up to this many other .py files) to the "
                        "server first, as an editor does, and use its memory of them; adds a no-context row")
    p.add_argument("--ngram-cache-row", action="store_true",
                   help="--client line: add a row without the server's cross-request n-gram cache")
    p.add_argument("--concurrent", type=positive(int), nargs="+", default=[1], metavar="K",
                   help="editors typing at once, each its own files (round-robin over --source/--files, which "
                        "must give at least K) and its own X-Client-Id; adds throughput and the server's batching. "
                        "Several values: a row each, a server started for each (how many editors a server serves)")
    p.add_argument("--accept-ms", type=positive(int, zero=True), default=0, metavar="MS",
                   help="a user who takes a one-line suggestion of the line's rest MS after it shows, whereupon "
                        "the editor asks again at the line's end (what the server's prefetch answers); 0: never")
    p.add_argument("--think-ms", type=positive(int, zero=True), default=0, metavar="MS",
                   help="each editor's next pause 0.5-1.5x MS after an answer shows (a user typing; its "
                        "background requests run meanwhile, and a pause that comes before they end waits for them "
                        "as llama.vim does); 0: at once, a closed loop that keeps the server busy")
    p.add_argument("--keystroke-ms", type=positive(int, zero=True), default=0, metavar="MS",
                   help="--client llama-vim: type every character between the pauses, 0.5-1.5x MS apart, from when "
                        "the pause before shows its suggestion; llama.vim asks at every keystroke, one request at "
                        "a time (not with --think-ms or --accept-ms); 0: requests at the pauses only")
    p.add_argument("--url", help="use this running server instead of starting one")
    p.add_argument("--api-key", help="with --url: the server's API key")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="also write the JSON report here")
    p.set_defaults(run=run)
