"""Where a one-token decode step's time goes (int4, 512 cached tokens): `python docs/results/step-split-zen4/step.py [MODEL]`."""
import sys, time, statistics as st
import torch
from dyncomplete.models import load
from dyncomplete.data.splits import source_files
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b"
m = load(name, quant="int4", progress=lambda s: None)
text = source_files(split="test")[0].read_text()
ids = m.tokenizer(text).input_ids[:512]
cache = m.new_cache()
with torch.inference_mode():
    logits = m.forward(torch.tensor(ids), cache)
    tok = int(logits[0, -1].argmax())
    parts = {k: [] for k in ("context", "embed", "layers", "norm", "head", "argmax", "total")}
    for step in range(96):
        t0 = time.perf_counter()
        start = cache.lengths[0]
        ctx = m.context(torch.arange(start, start + 1))
        t1 = time.perf_counter()
        h = m.embed(torch.tensor([[tok]]), ctx)
        t2 = time.perf_counter()
        h = m.run_layers(0, h, ctx, cache)
        t3 = time.perf_counter()
        n = m.final_norm(h)
        t4 = time.perf_counter()
        lg = m.head(n).float()
        t5 = time.perf_counter()
        tok = int(lg[0, -1].argmax())
        t6 = time.perf_counter()
        if step >= 32:
            for k, a, b in (("context", t0, t1), ("embed", t1, t2), ("layers", t2, t3), ("norm", t3, t4), ("head", t4, t5), ("argmax", t5, t6), ("total", t0, t6)):
                parts[k].append((b - a) * 1000)
    for k, v in parts.items():
        print(f"{k:8s} median {st.median(v):7.3f} ms")
    # the plain forward
    ts = []
    for step in range(64):
        t0 = time.perf_counter()
        lg = m.forward(torch.tensor([tok]), cache)
        tok = int(lg[0, -1].argmax())
        ts.append((time.perf_counter() - t0) * 1000)
    print("forward+argmax median", round(st.median(ts[16:]), 3))
