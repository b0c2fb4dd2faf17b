"""q new prompt tokens after 480 cached: decode.c against oneDNN's bfloat16 GEMM, one process, alternating
(`python3 crossover.py MODEL 17,24,...`)."""
import statistics, sys, time, torch
from dyncomplete.models import load
from dyncomplete.bench.speed import PROMPT_FILE
torch.set_num_threads(2)
m = load(sys.argv[1], quant="auto", progress=lambda *a: None)
o = m.engines["fast"]
ids = m.tokenizer(PROMPT_FILE.read_text() * 3, add_special_tokens=False).input_ids
ctx = 480
with torch.inference_mode():
    o.native_prompt_max = None
    cache = m.new_cache(); m.fill(ids[:ctx], cache)
    for q in [int(x) for x in sys.argv[2].split(",")]:
        res = {}
        for rnd in range(2):
            for path in (True, False):
                o.native_prompt_max = None if path else 16
                ts = []
                for _ in range(5):
                    cache.crop(ctx); t = time.perf_counter(); m.forward(torch.tensor(ids[ctx:ctx + q]), cache); ts.append(time.perf_counter() - t)
                res.setdefault(path, []).append(statistics.median(ts) * 1000)
        print(f"q={q}: decode.c {' '.join(f'{x:.1f}' for x in res[True])} ms, GEMM {' '.join(f'{x:.1f}' for x in res[False])} ms", flush=True)
