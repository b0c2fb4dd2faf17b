"""Two builds of decode.c in one process, taken in turn each round (the order reversed every other
round): a greedy decode step at 480-544 cached tokens (the median of 64 model.forward + argmax),
and passes over K new positions at 480 (medians of 12). Both builds read the same weights, so
they must share the packed layout. Build them first:
  F="-O3 -march=native -fopenmp -ffp-contract=off -shared -fPIC"
  git show REV:dyncomplete/models/native/decode.c > /tmp/old.c; gcc $F /tmp/old.c -o /tmp/lib_old.so -lm
  gcc $F dyncomplete/models/native/decode.c -o /tmp/lib_new.so -lm
python docs/results/l2-prefetch/probe.py MODEL ROUNDS /tmp/lib_old.so /tmp/lib_new.so   (ROWS=4,8,16: passes of those rows)
With N in the environment (N=3000 ...) the cache holds N tokens of the standard library's test
split instead of 480 of argparse.py (docs/results/blocked-keys/)."""
import argparse
import os
import pathlib
import statistics
import sys
import time

import torch

from dyncomplete.data.splits import source_files
from dyncomplete.engine.sampling import greedy_index
from dyncomplete.models import load, native
from dyncomplete.models.native import bindings

PASS_ROWS = tuple(int(k) for k in os.environ.get("ROWS", "2,3,8").split(","))  # ROWS=4,8,16: other passes
torch.set_num_threads(2)
model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
builds = {"old": native.compile_library(pathlib.Path(sys.argv[3])),
          "new": native.compile_library(pathlib.Path(sys.argv[4]))}
N = int(os.environ.get("N", 480))
text = "\n".join(f.read_text() for f in source_files(split="test")[:8]) if "N" in os.environ else open(argparse.__file__).read()
ids = model.tokenizer(text)["input_ids"][:N + 64]
cache = model.new_cache()
first = greedy_index(model.forward(torch.tensor(ids[:N]), cache)[0, -1])
shapes = ["step", *(f"{k} rows" for k in PASS_ROWS)]
ms = {(build, shape): [] for build in builds for shape in shapes}
tokens = {}


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


with torch.inference_mode():
    for round_ in range(int(sys.argv[2])):
        for build in (list(builds) if round_ % 2 == 0 else list(builds)[::-1]):
            bindings.library = lambda lib=builds[build]: lib
            cache.crop(N)
            out, times = [first], []
            for k in range(64):
                times.append(timed(lambda: out.append(greedy_index(
                    model.forward(torch.tensor(out[-1:]), cache, start=N + k)[0, -1]))))
            tokens.setdefault(build, out)
            ms[(build, "step")].append(statistics.median(times) * 1000)
            for k in PASS_ROWS:
                times = []
                for _ in range(12):
                    cache.crop(N)
                    times.append(timed(lambda: model.forward(torch.tensor(ids[N:N + k]), cache, start=N,
                                                             last_only=False)))
                ms[(build, f"{k} rows")].append(statistics.median(times) * 1000)
print(f"{sys.argv[1]}, {sys.argv[2]} rounds; the same greedy tokens in both builds: {tokens['old'] == tokens['new']}")
for shape in shapes:
    old, new = ms[("old", shape)], ms[("new", shape)]
    ratios = sorted(b / a for a, b in zip(old, new))
    print(f"{shape:>7}: old {statistics.median(old):6.2f} ms, new {statistics.median(new):6.2f} ms; new/old in a round "
          f"median {statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}), lower in {sum(r < 1 for r in ratios)} of {len(ratios)}")
