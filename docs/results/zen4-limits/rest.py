"""What a greedy decode step spends outside its two native calls (the layers and the head's
product), part by part: the steps of `LayeredModel.forward` run one by one and timed, medians of
6 rounds of 32 steps at 480-512 cached tokens. python docs/results/zen4-limits/rest.py MODEL"""
import argparse
import statistics
import sys
import time

import torch

from dyncomplete.engine.sampling import greedy_index
from dyncomplete.models import load

model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
ids = model.tokenizer(open(argparse.__file__).read())["input_ids"][:480]
cache = model.new_cache()
first = greedy_index(model.forward(torch.tensor(ids), cache)[0, -1])
engine, layers = model.engines["fast"], range(model.num_layers)
spent: dict[str, list[int]] = {}


def tick(part: str, start: int) -> int:
    now = time.perf_counter_ns()
    spent.setdefault(part, []).append(now - start)
    return now


with torch.inference_mode():
    for _ in range(6):
        cache.crop(480)
        token = first
        for k in range(32):
            t = time.perf_counter_ns()
            ids_now = torch.tensor([token]).reshape(1, -1)
            ctx = model.context(torch.arange(480 + k, 481 + k))
            t = tick("token tensor, positions, rotary rows", t)
            hidden = model.embed(ids_now, ctx)
            t = tick("embedding", t)
            step = ctx.state_of(engine)
            start, keys = engine._native_room(layers, hidden, ctx, step, cache)
            values = [cache.values[i] for i in layers]
            t = tick("cache checks, buffer lists", t)
            out = engine.native.forward(layers, hidden, start, None, keys, values, step.cos, step.sin)
            for i in layers:
                cache.lengths[i] += 1
            t = tick("layers (native)", t)
            normed = model.final_norm(out[:, -1:])
            t = tick("final norm", t)
            logits = model.head(normed)
            t = tick("head (native)", t)
            token = greedy_index(logits.float()[0, -1])
            t = tick("float32 logits, argmax", t)
for part, ns in spent.items():
    print(f"{sys.argv[1]}: {part:38s} {statistics.median(ns) / 1000:8.1f} us")
with torch.inference_mode():  # the same final norm again and again, its caches warm
    for _ in range(100):
        model.final_norm(out[:, -1:])
    start = time.perf_counter_ns()
    for _ in range(1000):
        model.final_norm(out[:, -1:])
print(f"{sys.argv[1]}: {'final norm, 1,000 in a row, each':38s} {(time.perf_counter_ns() - start) / 1e6:8.1f} us")
