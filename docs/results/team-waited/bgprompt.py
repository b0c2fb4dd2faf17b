"""How many prompt tokens llama.vim's background requests make the server evaluate, against its pauses' own: one editor
moving down two files, about 1 s of typing, a `--parallel 4` server. Not a test. Usage: python bgprompt.py [serve arguments]"""
import sys
from pathlib import Path
import httpx
from dyncomplete.bench.launch import running_server
from dyncomplete.bench.session import cursors_of, replay_editors

SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
FILES = [SITE + f for f in ("click/core.py", "rich/console.py")]
cursors = [c for f in FILES for c in cursors_of(Path(f), "down", 0.5, 20)]
with running_server("qwen2.5-coder-0.5b", "--method", "lookup", "--methods", "lookup", "--log-level", "error",
                    "--dtype", "auto", "--device", "cpu", "--quant", "auto", "--context-budget", "1024",
                    "--parallel", "4", *sys.argv[1:]) as (url, proc):
    before = httpx.get(f"{url}/health").json()["worker"]
    results, served = replay_editors(url, "qwen2.5-coder-0.5b", "llama-vim", cursors, 128, {}, 1, think_ms=1000)
    after = httpx.get(f"{url}/health").json()["worker"]
total = after.get("prompt_tokens_evaluated", 0) - before.get("prompt_tokens_evaluated", 0)
fg = sum(r["prompt_evaluated"] or 0 for r in results if not r["from_cache"])
asked = sum(not r["from_cache"] for r in results)
bg = sum(r["background_requests"] for r in results)
print(f"pauses {len(results)} asked {asked} background requests {bg}")
print(f"prompt tokens evaluated: all {total}, pauses' own {fg}, background {total - fg} "
      f"({(total - fg) / max(bg, 1):.1f} a background request, {fg / max(asked, 1):.1f} a pause)")
print({k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], (int, float)) and k.startswith(("stopped", "tokens"))})
