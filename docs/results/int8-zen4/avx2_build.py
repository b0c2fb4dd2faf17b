"""int4 against int8 on Qwen2.5-Coder-0.5B in the AVX2 build of decode.c (what AMD Zen 2/3 run) and in
this CPU's build, on one machine: a 512-token prompt, then one-token and 8-position passes at 512
cached tokens (60 each, median). `PYTHONPATH=/work/main python3 avx2_build.py avx2|native`."""
import sys, time, torch
from pathlib import Path
from dyncomplete.models import load, native
from dyncomplete.models.native import bindings
from dyncomplete.bench.speed import PROMPT_FILE
torch.set_num_threads(2)
build = sys.argv[1]
if build == "avx2":
    flags = [f if f != "-march=native" else "-march=x86-64-v3" for f in native.FLAGS]
    lib = native.compile_library(Path("/tmp/avx2-decode.so"), flags)
    bindings.library = lambda: lib
for quant in ("int4", "int8"):
    m = load("qwen2.5-coder-0.5b", quant=quant, progress=lambda *a: None)
    ids = torch.tensor(m.tokenizer(PROMPT_FILE.read_text() * 3, add_special_tokens=False).input_ids[:600])
    out = []
    with torch.inference_mode():
        c = m.new_cache(); t = time.perf_counter(); m.forward(ids[:512], c); pre = 512 / (time.perf_counter() - t)
        for k in (1, 8):
            ts = []
            for i in range(60):
                c.crop(512); t = time.perf_counter(); m.forward(ids[512:512 + k], c, last_only=False); ts.append(time.perf_counter() - t)
            ts.sort(); out.append(f"{k} rows {1000 * ts[len(ts) // 2]:.1f} ms")
    print(build, quant, f"prefill {pre:.0f} tok/s,", ", ".join(out), flush=True)
