"""A Qwen decode step at 1,000 cached tokens (the median, mean and p95 of 150) alone, then with a
Python thread in the same process that spins BUSY ms out of every BUSY + IDLE ms at nice NICE
(as a server's slot and HTTP threads do beside the model): python contend.py BUSY IDLE NICE"""
import sys, time, threading, statistics as st, os
import torch
from dyncomplete.models import load
from dyncomplete.data.splits import source_files
m = load("qwen2.5-coder-0.5b", quant="int4", progress=lambda s: None)
ids = m.tokenizer("\n".join(f.read_text() for f in source_files(split="test")[:6])).input_ids
torch.set_num_threads(2)
stop = [False]; busy_ms, idle_ms = float(sys.argv[1]), float(sys.argv[2]); nice = int(sys.argv[3])
def spinner():
    if nice: os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    while not stop[0]:
        t = time.perf_counter()
        while time.perf_counter() - t < busy_ms / 1000: pass
        time.sleep(idle_ms / 1000)
n = 1000
with torch.inference_mode():
    cache = m.new_cache()
    for a in range(0, n, 128): m.forward(torch.tensor(ids[a:min(n, a+128)]), cache)
    def steps():
        ts = []
        for k in range(150):
            cache.crop(n); t = time.perf_counter(); m.forward(torch.tensor([ids[n]]), cache); ts.append((time.perf_counter()-t)*1000)
        return st.median(ts), st.mean(ts), sorted(ts)[int(len(ts)*0.95)]
    for rnd in range(2):
        print("alone  median/mean/p95", [round(x, 2) for x in steps()])
        stop[0] = False; th = threading.Thread(target=spinner); th.start()
        print(f"with a Python thread busy {busy_ms}/{busy_ms+idle_ms} ms, nice {nice}:", [round(x, 2) for x in steps()])
        stop[0] = True; th.join()
