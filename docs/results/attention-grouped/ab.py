"""Paired A/B of two decode.c builds in one process: passes of 1, 8 and 16 positions after C cached
tokens, builds alternating every pass (the same noise for both), outputs checked equal bit for bit.
Prints medians and the new/old ratio.

Usage: python ab.py MODEL RUNS OLD.c NEW.c, e.g. with
git show ea2b394:dyncomplete/models/native/decode.c > /tmp/old.c (NEW.c: the current decode.c)."""
import hashlib, statistics, sys, tempfile, time, torch
from pathlib import Path
from dyncomplete.models import load, native
libs, build = {}, Path(tempfile.mkdtemp())
for v, source in zip(("old", "new"), sys.argv[3:5]):
    source = Path(source)
    so = build / f"{hashlib.sha256(source.read_bytes()).hexdigest()[:16]}.so"  # never a stale build
    original, native.SOURCE = native.SOURCE, source  # compile_library compiles native.SOURCE
    libs[v] = native.compile_library(so)
    native.SOURCE = original
model = load(sys.argv[1], progress=lambda m: None, quant="int4")
runs = int(sys.argv[2])
with torch.inference_mode():
    for ctx in (256, 1024, 2048):
        ids = torch.arange(ctx + 16) % 1000 + 10
        cache = model.new_cache()
        model.forward(ids[:ctx], cache)
        t = {(v, k): [] for v in libs for k in (1, 8, 16)}
        outs = {}
        for r in range(runs + 1):
            for k in (1, 8, 16):
                for v in (("old", "new") if r % 2 else ("new", "old")):
                    native.library = lambda v=v: libs[v]
                    cache.crop(ctx)
                    s = time.perf_counter()
                    out = model.forward(ids[ctx:ctx + k], cache, last_only=False)
                    if r == 0:
                        outs[(v, k)] = out
                    if r:
                        t[(v, k)].append(time.perf_counter() - s)
        assert all(torch.equal(outs[("old", k)], outs[("new", k)]) for k in (1, 8, 16)), "outputs differ"
        med = {key: statistics.median(x) * 1e3 for key, x in t.items()}
        print(f"ctx {ctx}: " + "  ".join(f"{k} rows old {med[('old',k)]:.1f} new {med[('new',k)]:.1f} ({med[('new',k)]/med[('old',k)]:.2f})" for k in (1, 8, 16)), flush=True)
