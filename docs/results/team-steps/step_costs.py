"""What one batched call of the server's model thread (`LayeredModel.forward_batch`) costs on this
machine: Qwen2.5-Coder-0.5B int4, 1,000 tokens cached per sequence, every row's logits (a
verification pass's), the median of 7 calls. Rows of one sequence, then of four. Not a test: the
figures behind results.md's "Where four editors' time goes"."""
import random
import time

import torch

from dyncomplete.models import load

model = load("qwen2.5-coder-0.5b", dtype="auto", device="cpu", quant="auto", progress=lambda *_: None)
random.seed(0)
caches = []
for _ in range(4):
    cache = model.new_cache()
    model.forward(torch.tensor([random.randrange(1000, 20000) for _ in range(1000)]), cache)
    caches.append(cache)


def call_ms(shape: list[int]) -> float:
    times = []
    for _ in range(7):
        steps = [([random.randrange(1000, 20000) for _ in range(n)], c, c.lengths[0], n) for c, n in zip(caches, shape)]
        start = time.perf_counter()
        model.forward_batch(steps)
        times.append(time.perf_counter() - start)
        for c, n in zip(caches, shape):
            c.crop(c.lengths[0] - n)
    return 1000 * sorted(times)[3]


one = call_ms([1])
for shape in [[n] for n in (1, 2, 4, 8, 9, 12, 16, 17, 24, 32, 48, 64)] + [[1] * 4, [2] * 4, [5] * 4, [9] * 4, [16, 1, 1, 1]]:
    ms = call_ms(shape)
    print(f"{'+'.join(map(str, shape)):>10} rows: {ms:6.1f} ms, {ms / one:4.2f} one-row calls")
