"""dyncomplete serve with the parts of a request's slot work timed and printed per request (stderr):
python docs/results/slot-python/serve_timed.py serve --model M --port 8931 --parallel 4 ARGS..."""
import sys, time, threading
from dyncomplete.serve import worker as W
from dyncomplete.serve.prefix_cache import PrefixCache
local = threading.local()
from dyncomplete.serve import prefix_cache as PCM
from dyncomplete.models.kv_cache import KVCache
class TimedRuns(PCM.Runs):
    def __init__(self, *a, **k):
        t = time.perf_counter(); super().__init__(*a, **k)
        d = getattr(local, "d", None)
        if d is not None: d["runs"] = d.get("runs", 0) + 1000 * (time.perf_counter() - t)
PCM.Runs = TimedRuns
EXTRA = ((PCM.PrefixCache, "_reused_by", "plans"), (KVCache, "copy", "copy"), (PCM, "assemble", "assemble"),
         (PCM, "common_prefix_length", "prefixes"))
def timed(owner, name, key):
    f = getattr(owner, name)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            d = getattr(local, "d", None)
            if d is not None: d[key] = d.get(key, 0) + 1000 * (time.perf_counter() - t)
    setattr(owner, name, g)
for owner, name, key in ((W, "build_prompt", "prompt"), (PrefixCache, "lookup", "lookup"), (PrefixCache, "store", "store"),
                         (W.Worker, "_generate", "generate")) + EXTRA:
    timed(owner, name, key)
run = W.Worker._run
def _run(self, job, slot, *a, **k):
    local.d = {}; t = time.perf_counter()
    try: return run(self, job, slot, *a, **k)
    finally:
        total = 1000 * (time.perf_counter() - t); d = local.d; local.d = None
        print(f"run {total:6.1f} queue {1000*(t - job.submitted):5.1f} " + " ".join(f"{k} {v:6.1f}" for k, v in d.items())
              + f" other {total - sum(d.values()):5.1f}", file=sys.stderr, flush=True)
W.Worker._run = _run
sys.argv = ["dyncomplete", *sys.argv[1:]]
from dyncomplete.cli import main
main()
