"""Per-pause waits of llama.vim typing every character (`--keystroke-ms`) through a `--parallel 4` server: the
four files of results.md's keystroke section, K editors. Not a test. Usage: [FILES=N] python trace.py K LINES MS OUT.json [serve arguments]"""
import json, os, sys
from pathlib import Path
from dyncomplete.bench.launch import running_server
from dyncomplete.bench.session import cursors_of, replay_editors, summarise_editor
SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
FILES = [SITE + f for f in ("click/core.py", "httpx/_client.py", "rich/console.py", "requests/models.py")]
k, lines, ks, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
nfiles = int(os.environ.get("FILES", 4))
cursors = [c for f in FILES[:nfiles] for c in cursors_of(Path(f), "down", 0.5, lines)]
FIELDS = ("editor", "pause", "where", "waited_s", "held_back_s", "from_cache", "prompt_evaluated", "prompt_reused", "generated",
          "background_requests", "background_s", "think_s", "es", "text")
with running_server("qwen2.5-coder-0.5b", "--method", "lookup", "--methods", "lookup", "--log-level", "error",
                    "--dtype", "auto", "--device", "cpu", "--quant", "auto", "--context-budget", "1024",
                    "--parallel", "4", *sys.argv[5:]) as (url, proc):
    results, served = replay_editors(url, "qwen2.5-coder-0.5b", "llama-vim", cursors, 128, {}, k, keystroke_ms=ks)
row = summarise_editor(results) | served
print({x: row.get(x) for x in ("p50_ms", "p95_ms", "completions_per_s", "es", "batch_p50", "background_requests")})
Path(out).write_text(json.dumps([{x: r.get(x) for x in FIELDS} for r in results]))
for r in results:
    print(r["editor"], r["pause"], r["where"].rsplit("/", 1)[1], f"w={r['waited_s']:.3f} held={r['held_back_s']:.3f} cache={r['from_cache']} pe={r['prompt_evaluated']} gen={r['generated']} bg={r['background_requests']} es={r['es']:.0f}")
