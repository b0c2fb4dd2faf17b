"""What a batched model call costs by the sequences in it and the rows each brings (a decode
step: 1 row; a verification: 1 + drafted), Qwen2.5-Coder-0.5B int4, each sequence 1,000 cached
tokens, on a quiet machine. Not a test. Usage: python steps.py"""
import json
import statistics
import time

from dyncomplete.models.loading import load

CACHED = 1000
model = load("qwen2.5-coder-0.5b", quant="auto", progress=lambda *a: None)
caches = []
for _ in range(4):
    cache = model.new_cache()
    for a in range(0, CACHED, 64):
        model.forward_batch([(list(range(1000 + a, 1000 + min(a + 64, CACHED))), cache, a, 1)])
    caches.append(cache)


def call_ms(sequences: int, rows: int, runs: int = 30) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model.forward_batch([([5] * rows, caches[s], CACHED, rows) for s in range(sequences)])
        times.append(time.perf_counter() - start)
        for cache in caches[:sequences]:
            cache.crop(CACHED)
    return statistics.median(times) * 1000


print(json.dumps({f"{s}x{r}": round(call_ms(s, r), 1) for r in (1, 2, 3) for s in (1, 2, 3, 4)}))
