"""Where a greedy decode step's time goes at 480-512 cached tokens: the native call over every
layer, the LM head's product, and the rest (Python, embedding, final norm, logits to float32,
argmax). Three rounds of 8 x 32 steps, each round from the same 480-token cache:
python docs/results/zen4-step/overhead.py MODEL"""
import argparse
import sys
import time

import torch

from dyncomplete.engine.sampling import greedy_index
from dyncomplete.models import load
from dyncomplete.models import weights
from dyncomplete.models.native import bindings

model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
ids = model.tokenizer(open(argparse.__file__).read())["input_ids"][:480]
spent = {"layers": 0.0, "head": 0.0}


def timed(function, key):
    def run(*args, **kwargs):
        start = time.perf_counter()
        out = function(*args, **kwargs)
        spent[key] += time.perf_counter() - start
        return out
    return run


bindings.Layers.forward = timed(bindings.Layers.forward, "layers")
weights.bindings.linear = timed(bindings.linear, "head")  # every product outside a layer call: the head
cache = model.new_cache()
first = greedy_index(model.forward(torch.tensor(ids), cache)[0, -1])
for _ in range(3):
    spent.update(layers=0.0, head=0.0)
    steps, start = 0, time.perf_counter()
    for _ in range(8):
        cache.crop(480)
        token = first
        for k in range(32):
            token = greedy_index(model.forward(torch.tensor([token]), cache, start=480 + k)[0, -1])
            steps += 1
    total = (time.perf_counter() - start) / steps * 1000
    layers, head = spent["layers"] / steps * 1000, spent["head"] / steps * 1000
    print(f"{sys.argv[1]}: step {total:.2f} ms = layers {layers:.2f} + head {head:.2f} + rest {total - layers - head:.2f}")
