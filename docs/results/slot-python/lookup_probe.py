"""python docs/results/slot-python/lookup_probe.py: ms per prefix-cache lookup with chunk reuse: 8 stored prompts of four files (two each), then
prompts of one of them with a line typed; the cache of real prefills (Qwen 0.5B, int4)."""
import random, statistics, sys, time
import torch
from dyncomplete.models import load
from dyncomplete.models.rotary import shift_frequencies
from dyncomplete.serve.prefix_cache import PrefixCache
torch.set_num_threads(2)
model = load("qwen2.5-coder-0.5b", quant="auto", progress=lambda m: None)
tok = model.tokenizer
S = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
texts = [open(S + f).read()[20000:26000] for f in ("click/core.py", "httpx/_client.py", "rich/console.py", "requests/models.py")]
pc = PrefixCache(512 * 2**20, 32, shift_frequencies(model), 2, 64)
prompts = []
with torch.inference_mode():
    for text in texts:
        for cut in (2000, 2100):
            ids = tok(text[:cut] + "\n" + text[cut:], add_special_tokens=False).input_ids[:1500]
            cache = model.new_cache(); model.forward(torch.tensor(ids), cache, last_only=True)
            pc.store(ids, cache); prompts.append(ids)
times = []
random.seed(1)
for r in range(40):
    text = texts[r % 4]; cut = 2100 + random.randrange(1, 300)
    ids = tok(text[:cut] + "    x = 1\n" + text[cut:], add_special_tokens=False).input_ids[:1500]
    t = time.perf_counter(); cache, n = pc.lookup(ids, touch=False, cursor=len(tok(text[:cut]).input_ids)); times.append(time.perf_counter() - t)
print(f"lookup median {1000 * statistics.median(times):.2f} ms (n={len(times)}, reused median {n})")
