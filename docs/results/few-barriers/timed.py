"""The timed build (instrument.py) over 300 steps at N cached tokens: python docs/results/few-barriers/timed.py MODEL N"""
import sys, time, ctypes, pathlib, statistics as st
import torch
from dyncomplete.models import load, native
from dyncomplete.models.native import bindings
from dyncomplete.data.splits import source_files
name, n = sys.argv[1], int(sys.argv[2])
m = load(name, quant="int4", progress=lambda s: None)
lib = native.compile_library(pathlib.Path("/tmp/p/lib_timed.so"))
bindings.library = lambda: lib
ids = m.tokenizer("\n".join(f.read_text() for f in source_files(split="test")[:6])).input_ids
torch.set_num_threads(2)
names = {0: "in-norm", 1: "qkv quantize", 2: "qkv product", 3: "rope+store", 4: "q copy", 5: "attention", 6: "o quantize", 7: "o product",
         8: "residual+norm", 9: "gate_up quantize", 10: "gate_up product", 11: "swiglu", 12: "down quantize", 13: "down product", 14: "out", 15: "end"}
buf = (ctypes.c_double * 128)()
with torch.inference_mode():
    cache = m.new_cache()
    for a in range(0, n, 128):
        m.forward(torch.tensor(ids[a:min(n, a+128)]), cache)
    tok = ids[n]; steps = 300
    for k in range(50):
        cache.crop(n); m.forward(torch.tensor([tok]), cache)
    lib.timers_dump(buf)
    t0 = time.perf_counter(); c0 = __import__("time").perf_counter_ns()
    for k in range(steps):
        cache.crop(n)
        ctx = m.context(torch.arange(n, n + 1))
        h = m.embed(torch.tensor([[tok]]), ctx)
        m.run_layers(0, h, ctx, cache)
    wall = (time.perf_counter() - t0) / steps * 1e3
    lib.timers_dump(buf)
ghz = 2.596
print(f"{name} at {n}: python loop {wall:.3f} ms/step (context+embed+run_layers)")
tot = [0, 0]
for s in range(16):
    w = [buf[(s*2+t)*2] / ghz / 1e6 / steps for t in range(2)]
    q = [buf[(s*2+t)*2+1] / ghz / 1e6 / steps for t in range(2)]
    tot[0] += w[0] + q[0]; tot[1] += w[1] + q[1]
    if s in names:
        print(f"{names[s]:18s} work t0 {w[0]:.3f} t1 {w[1]:.3f}   wait t0 {q[0]:.3f} t1 {q[1]:.3f} ms/step")
print("total in region", [round(x, 3) for x in tot])
