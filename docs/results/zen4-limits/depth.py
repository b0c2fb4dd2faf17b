"""A greedy decode step at several cache depths, and the native call over every layer in it (the
rest is the head's product and Python): 3 rounds of 32 steps from the same cache at each depth.
The prompt: the standard library's argparse.py and typing.py, read on this machine.
python docs/results/zen4-limits/depth.py MODEL 16,512,2048,4096"""
import sys
import sysconfig
import time
from pathlib import Path

import torch

from dyncomplete.engine.sampling import greedy_index
from dyncomplete.models import load
from dyncomplete.models.native import bindings

model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
stdlib = Path(sysconfig.get_paths()["stdlib"])
ids = model.tokenizer("".join((stdlib / f).read_text() for f in ("argparse.py", "typing.py")))["input_ids"]
spent = {"layers": 0.0}
layers_forward = bindings.Layers.forward


def timed(*args, **kwargs):
    start = time.perf_counter()
    out = layers_forward(*args, **kwargs)
    spent["layers"] += time.perf_counter() - start
    return out


bindings.Layers.forward = timed
for depth in [int(x) for x in sys.argv[2].split(",")]:
    cache = model.new_cache()
    for a in range(0, depth, 512):
        model.forward(torch.tensor(ids[a : min(depth, a + 512)]), cache)
    rounds = []
    for _ in range(3):
        spent["layers"] = 0.0
        cache.crop(depth)
        token, start = ids[depth], time.perf_counter()
        for k in range(32):
            token = greedy_index(model.forward(torch.tensor([token]), cache, start=depth + k)[0, -1])
        rounds.append(f"step {(time.perf_counter() - start) / 32 * 1000:.2f} ms, layers {spent['layers'] / 32 * 1000:.2f}")
    print(f"{sys.argv[1]} at {depth} cached tokens: " + "; ".join(rounds), flush=True)
