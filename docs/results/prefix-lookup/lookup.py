"""What one prefix-cache lookup and store cost, with the server's defaults (--cache-mb 512,
--cache-reuse 32, --cache-reuse-copies 2, --cache-reuse-near 64) and Qwen2.5-Coder-0.5B's cache
shapes (24 layers, 2 kv heads of 64, bf16): four editors moving down four site-packages files,
a 1,000-token fill-in-the-middle prompt each (token ids from the characters, random keys and
values: the cost does not depend on them), with the native kernels loaded, as a server with int4
or int8 weights (the default) has them. Not a test. Usage: python lookup.py; for an older
commit, `git worktree add /tmp/old REV` and `PYTHONPATH=/tmp/old python lookup.py`."""
import json
import statistics
import sys
import time

import torch

import dyncomplete
from dyncomplete.models import KVCache, native
from dyncomplete.serve.prefix_cache import PrefixCache

SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
FILES = [open(SITE + f).read().split("\n") for f in ("click/core.py", "httpx/_client.py", "rich/console.py", "requests/models.py")]
LAYERS, KV_HEADS, HEAD_DIM, SPAN = 24, 2, 64, 256
inv_freq = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))


def prompt(lines: list[str], line: int) -> list[int]:
    """<suffix> the next 20 lines <prefix> the 60 before <middle>, as llama.cpp's /infill orders them."""
    prefix, suffix = "\n".join(lines[max(0, line - 60):line]), "\n".join(lines[line:line + 20])
    return [1] + [ord(c) % 5000 for c in suffix][:300] + [2] + [ord(c) % 5000 for c in prefix][-700:] + [3]


def filled(ids: list[int]) -> KVCache:
    cache, capacity = KVCache(LAYERS), -(-(len(ids) + 20) // SPAN) * SPAN
    for i in range(LAYERS):
        cache.keys[i] = torch.randn(1, KV_HEADS, HEAD_DIM, capacity).to(torch.bfloat16)
        cache.values[i] = torch.randn(1, KV_HEADS, capacity, HEAD_DIM).to(torch.bfloat16)
        cache.lengths[i] = len(ids)
    return cache


native.available()  # builds or loads them
torch.manual_seed(0)
cache = PrefixCache(512 * 2**20, 32, inv_freq, 2, 64)
lookups, stores = [], []
for pause in range(60):
    for lines in FILES:
        ids = prompt(lines, 900 + pause)
        start = time.perf_counter()
        cache.lookup(ids, cursor=len(ids) - 1)
        lookups.append(time.perf_counter() - start)
        kept = filled(ids)
        start = time.perf_counter()
        cache.store(ids, kept)
        stores.append(time.perf_counter() - start)
print(json.dumps({"code": dyncomplete.__file__, "threads": torch.get_num_threads(), "entries": len(cache),
                  "lookups": len(lookups), "lookup_ms_p50": round(statistics.median(lookups) * 1000, 2),
                  "store_ms_p50": round(statistics.median(stores) * 1000, 2)}), file=sys.stdout)
