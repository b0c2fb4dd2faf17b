"""Paired A/B of the prompt pass (`python3 prefill_ab.py MODEL LABEL` under one build's PYTHONPATH): 512 tokens of json/decoder.py (bench.speed's prompt), the
fill path prompts take in the server, 5 passes a process, median; run under each build's
PYTHONPATH in turn."""
import statistics, sys, time, torch
from dyncomplete.models import load
from dyncomplete.bench.speed import PROMPT_FILE
torch.set_num_threads(2)
name = sys.argv[1]
m = load(name, quant="auto", progress=lambda *a: None)
ids = m.tokenizer(PROMPT_FILE.read_text() * 3, add_special_tokens=False).input_ids[:512]
with torch.inference_mode():
    m.fill(ids[:32], m.new_cache())
    ts = []
    for _ in range(5):
        c = m.new_cache(); t = time.perf_counter(); m.fill(ids, c); ts.append(time.perf_counter() - t)
print(f"{name} {sys.argv[2]}: prefill {512 / statistics.median(ts):.1f} tok/s (passes: {', '.join(f'{512 / x:.0f}' for x in ts)})")
