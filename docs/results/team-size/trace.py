"""Per-pause latencies of llama.vim moving down the four files of results.md's "How many editors
one replica serves" (`replay_editors` called directly, a server with `--parallel 4` started for
each count), and the server's CPU seconds by thread. Not a test.
Usage: THINK=MS python trace.py K[,K...] OUT.json [extra serve arguments]"""
import collections
import glob
import json
import os
import sys
from pathlib import Path

from dyncomplete.bench.launch import running_server
from dyncomplete.bench.session import cursors_of, replay_editors, summarise_editor

SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
FILES = [SITE + f for f in ("click/core.py", "httpx/_client.py", "rich/console.py", "requests/models.py")]
FIELDS = ("editor", "pause", "latency_s", "prompt_evaluated", "prompt_reused", "generated", "from_cache",
          "background_s", "background_requests", "es", "at_s", "think_s")
cursors = [c for f in FILES for c in cursors_of(Path(f), "down", 0.5, 30)]
out = {}


def cpu_by_thread(pid: int) -> dict[str, float]:
    seconds = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        stat = open(task + "/stat").read().rsplit(")", 1)[1].split()
        seconds[task.rsplit("/", 1)[1]] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


for k in (int(x) for x in sys.argv[1].split(",")):
    with running_server("qwen2.5-coder-0.5b", "--method", "lookup", "--methods", "lookup", "--log-level", "error",
                        "--dtype", "auto", "--device", "cpu", "--quant", "auto", "--context-budget", "1024",
                        "--parallel", "4", *sys.argv[3:]) as (url, proc):
        before = cpu_by_thread(proc.pid)
        results, served = replay_editors(url, "qwen2.5-coder-0.5b", "llama-vim", cursors, 128, {}, k,
                                         think_ms=int(os.environ.get("THINK", 0)))
        used = collections.Counter({t: s - before.get(t, 0) for t, s in cpu_by_thread(proc.pid).items()})
        print("server CPU s by thread", {t: round(s, 1) for t, s in used.most_common(8)}, file=sys.stderr)
        row = summarise_editor(results) | served
        print(k, {x: row[x] for x in ("p50_ms", "p95_ms", "completions_per_s", "es", "batch_p50")}, file=sys.stderr)
        out[k] = [{x: r.get(x) for x in FIELDS} for r in results]
Path(sys.argv[2]).write_text(json.dumps(out))
