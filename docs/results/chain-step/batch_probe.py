"""Batched one-token steps of S sequences (continuous batching, `LayeredModel.forward_batch`)
through `FastEngine.forward_chains` (one call of decode.c: embedding, layers, final norm, head)
against the general path (contexts, `run_batch`, then the head), in one process, taken in turn,
the order reversed every other round. Prints each round's ms per batched step and the ratio.
python docs/results/chain-step/batch_probe.py MODEL SEQUENCES ROUNDS   (N=1500: cached tokens, default 400)"""
import os
import statistics
import sys
import time

import torch

from dyncomplete.bench.speed import PROMPT_FILE
from dyncomplete.models import load

torch.set_num_threads(2)
model = load(sys.argv[1], quant="auto", progress=lambda m: None)
engine = model.engines["fast"]
sequences = int(sys.argv[2])
cached = int(os.environ.get("N", "400"))
ids = model.tokenizer(PROMPT_FILE.read_text() * (1 + cached // 3000), add_special_tokens=False).input_ids


def steps(chains: bool, n: int = 48) -> tuple[float, list[list[int]]]:
    engine.chains = chains
    caches, tokens = [], []
    for s in range(sequences):  # prompts from different places in the file
        cache = model.new_cache()
        logits = model.forward(torch.tensor(ids[40 * s : 40 * s + cached]), cache)[0, -1]
        caches.append(cache)
        tokens.append([int(logits.argmax())])
    start = time.perf_counter()
    for k in range(n):
        outs = model.forward_batch([([t[-1]], c, cached + k, 1) for t, c in zip(tokens, caches)])
        for t, out in zip(tokens, outs):
            t.append(int(out[0].argmax()))
    return (time.perf_counter() - start) * 1000 / n, tokens


with torch.inference_mode():
    steps(True, 4), steps(False, 4)
    ratios = []
    for r in range(int(sys.argv[3])):
        ms, tokens = {}, {}
        for chains in ((False, True) if r % 2 == 0 else (True, False)):
            ms[chains], tokens[chains] = steps(chains)
        assert tokens[True] == tokens[False], "the two paths chose different tokens"
        ratios.append(ms[True] / ms[False])
        print(f"round {r}: general {ms[False]:.3f} ms, chains {ms[True]:.3f} ms, ratio {ratios[-1]:.3f}", flush=True)
    print(f"{sys.argv[1]} {sequences} sequences, {cached} cached: chains/general median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}), lower in {sum(r < 1 for r in ratios)} of {len(ratios)}")
