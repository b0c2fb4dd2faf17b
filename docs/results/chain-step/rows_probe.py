"""ms per `LayeredModel.forward_batch` call for several shapes (rows of each sequence: "1,1,1,16" is
three decode rows and a 16-token prompt chunk), each sequence at N cached tokens (default 1000),
the shapes taken in turn, the order reversed every other round; the median of ROUNDS, and its
ratio to the first shape's.
N=1000 python docs/results/chain-step/rows_probe.py MODEL ROUNDS SHAPE..."""
import os, statistics, sys, time
import torch
from dyncomplete.bench.speed import PROMPT_FILE
from dyncomplete.models import load
torch.set_num_threads(2)
model = load(sys.argv[1], quant="auto", progress=lambda m: None)
cached = int(os.environ.get("N", "1000"))
ids = model.tokenizer(PROMPT_FILE.read_text() * (1 + cached // 3000), add_special_tokens=False).input_ids
shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[3:]]
caches = []
for s in range(4):
    c = model.new_cache(); model.forward(torch.tensor(ids[40*s:40*s+cached]), c); caches.append(c)
def run(shape, n=12):
    t0 = time.perf_counter()
    for k in range(n):
        steps = [(ids[:r], caches[i], cached, 1) for i, r in enumerate(shape)]
        model.forward_batch(steps)
        for i in range(len(shape)):
            caches[i].lengths = [cached] * len(caches[i].lengths)
    return (time.perf_counter() - t0) * 1000 / n
res = {s: [] for s in shapes}
with torch.inference_mode():
    for s in shapes: run(s, 2)
    for r in range(int(sys.argv[2])):
        for s in (shapes if r % 2 == 0 else shapes[::-1]):
            res[s].append(run(s))
base = statistics.median(res[shapes[0]])
for s in shapes:
    m = statistics.median(res[s]); print(f"{'+'.join(map(str,s)):>12}: {m:7.2f} ms  {m/base:5.2f}x  rows {sum(s)}")
