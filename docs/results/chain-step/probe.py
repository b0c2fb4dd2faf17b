"""One-token decode steps through `FastEngine.forward_chain` (one call of decode.c: embedding,
layers, final norm, head) against the general path of `LayeredModel.forward` (step context,
`run_native`, then `logits`), in one process, taken in turn, the order reversed every other round.
Prints each round's ms per step and the ratio chain/general, then the median ratio.
python docs/results/chain-step/probe.py MODEL ROUNDS   (N=3000: cached tokens, default 480)"""
import os
import statistics
import sys
import time

import torch

from dyncomplete.bench.speed import PROMPT_FILE
from dyncomplete.engine.sampling import greedy_index
from dyncomplete.models import load

torch.set_num_threads(2)
model = load(sys.argv[1], quant="auto", progress=lambda m: None)
engine = model.engines["fast"]
cached = int(os.environ.get("N", "480"))
text = PROMPT_FILE.read_text()
ids = model.tokenizer(text * (1 + cached // 400), add_special_tokens=False).input_ids[:cached]


def steps(chains: bool, n: int = 64) -> tuple[float, list[int]]:
    engine.chains = chains
    cache = model.new_cache()
    logits = model.forward(torch.tensor(ids), cache)[0, -1]
    tokens = [greedy_index(logits)]
    start = time.perf_counter()
    for k in range(n):
        logits = model.forward(torch.tensor(tokens[-1:]), cache, start=cached + k)[0, -1]
        tokens.append(greedy_index(logits))
    return (time.perf_counter() - start) * 1000 / n, tokens


with torch.inference_mode():
    steps(True), steps(False)
    ratios = []
    for r in range(int(sys.argv[2])):
        order = (False, True) if r % 2 == 0 else (True, False)
        ms, tokens = {}, {}
        for chains in order:
            ms[chains], tokens[chains] = steps(chains)
        assert tokens[True] == tokens[False], "the two paths chose different tokens"
        general, chain = ms[False], ms[True]
        ratios.append(chain / general)
        print(f"round {r}: general {general:.3f} ms, chain {chain:.3f} ms, ratio {chain / general:.3f}", flush=True)
    print(f"{sys.argv[1]} cached {cached}: chain/general median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}), lower in {sum(r < 1 for r in ratios)} of {len(ratios)}")
