"""The native call over every layer at 480-512 cached tokens (32 steps a round), in one process
under four builds of decode.c taken in turn each round: OLD and NEW, and each with its products
left out (-DSKIP_PRODUCTS: what is left is attention, norms, rotary, quantized inputs, and the
threads' forks, joins and barriers). Build them first:
  F="-O3 -march=native -fopenmp -ffp-contract=off -shared -fPIC"
  gcc $F OLD.c -o /tmp/lib_old.so -lm; gcc $F -DSKIP_PRODUCTS OLD.c -o /tmp/lib_old_skip.so -lm
  (and /tmp/lib_new.so, /tmp/lib_new_skip.so from NEW.c; SKIP_PRODUCTS is a local edit of the
  product call in linear_f32 / linear_team, not kept in decode.c)
python docs/results/one-region/probe.py MODEL ROUNDS"""
import sys, time, statistics as st, argparse, pathlib
import torch
from dyncomplete.models import load, native
from dyncomplete.models.native import bindings
model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
libs = {n: native.compile_library(pathlib.Path(f"/tmp/lib_{n}.so")) for n in ("old", "new", "old_skip", "new_skip")}
ids = model.tokenizer(open(argparse.__file__).read())["input_ids"][:512]
cache = model.new_cache()
model.forward(torch.tensor(ids[:480]), cache)
engine = model.engines["fast"]
layers = range(model.num_layers)
res = {n: [] for n in libs}
with torch.inference_mode():
    for rnd in range(int(sys.argv[2])):
        for name, lib in libs.items():
            bindings.library = lambda lib=lib: lib
            cache.crop(480)
            t0 = time.perf_counter()
            for k in range(32):
                ctx = model.context(torch.arange(480 + k, 481 + k))
                hidden = model.embed(torch.tensor([[ids[480 + k]]]), ctx)
                step = ctx.state_of(engine)
                start, keys = engine._native_room(layers, hidden, ctx, step, cache)
                engine.native.forward(layers, hidden, start, None, keys, [cache.values[i] for i in layers], step.cos, step.sin)
                for i in layers: cache.lengths[i] += 1
            res[name].append((time.perf_counter() - t0) / 32 * 1000)
for name, v in res.items():
    print(f"{sys.argv[1]} layers call, {name}: median {st.median(v):.3f} ms ({min(v):.3f}-{max(v):.3f}), n={len(v)}")
for a, b in (("new", "old"), ("new_skip", "old_skip")):
    r = sorted(x / y for x, y in zip(res[a], res[b]))
    print(f"  {a}/{b} per round: median {st.median(r):.3f} ({r[0]:.3f}-{r[-1]:.3f}), lower in {sum(x < 1 for x in r)} of {len(r)}")
