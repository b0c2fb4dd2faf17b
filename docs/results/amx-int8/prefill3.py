"""One process, alternating: the prompt pass through oneDNN's bf16 GEMM, decode.c with VNNI, decode.c with AMX tiles. Needs amx-int8.patch applied (`amx_tiles`)."""
import statistics, sys, time, torch
from dyncomplete.models import load, native
from dyncomplete.bench.speed import PROMPT_FILE
torch.set_num_threads(2)
m = load(sys.argv[1], quant="auto", progress=lambda *a: None)
o, lib = m.engines["fast"], native.library()
ids = m.tokenizer(PROMPT_FILE.read_text() * 3, add_special_tokens=False).input_ids[:512]
paths = {"bf16 GEMM": (False, 1), "decode.c VNNI": (True, 0), "decode.c AMX": (True, 1)}
res = {k: [] for k in paths}
def setp(k):
    o.native_prefill, amx = paths[k]; lib.amx_tiles(amx)
with torch.inference_mode():
    for k in paths: setp(k); m.fill(ids[:64], m.new_cache())
    for rnd in range(int(sys.argv[2])):
        for k in paths:
            setp(k); ts = []
            for _ in range(3):
                c = m.new_cache(); t = time.perf_counter(); m.fill(ids, c); ts.append(time.perf_counter() - t)
            res[k].append(512 / statistics.median(ts))
for k, v in res.items(): print(f"{sys.argv[1]} {k}: {', '.join(f'{x:.0f}' for x in v)} tok/s")
