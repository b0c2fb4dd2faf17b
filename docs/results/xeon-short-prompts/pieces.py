"""A cancellable prefill (the server's: parts of PREFILL_CHUNK tokens) of 1,024 tokens, with native_prompt_max 96 (parts through decode.c) and 16 (through the GEMM, as before)."""
import time, torch
from dyncomplete.models import load
from dyncomplete.engine.method import prefill
from dyncomplete.engine.stats import Stats
from dyncomplete.bench.speed import PROMPT_FILE
torch.set_num_threads(2)
m = load("qwen2.5-coder-0.5b", quant="auto", progress=lambda *a: None)
o = m.engines["fast"]
print("limit", o.native_prompt_max)
ids = m.tokenizer(PROMPT_FILE.read_text() * 3, add_special_tokens=False).input_ids[:1024]
for lim in (96, 16, 96, 16):
    o.native_prompt_max = lim
    c = m.new_cache(); t = time.perf_counter(); out = prefill(m, ids, c, Stats(), cancelled=lambda: False); dt = time.perf_counter() - t
    print(lim, f"{dt*1000:.0f} ms", int(out.argmax()))
