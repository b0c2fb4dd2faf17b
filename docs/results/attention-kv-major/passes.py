"""A pass's time by its rows (1: a one-token step; 16: a prompt chunk of the batched server) and
the tokens already cached (medians of 7 rounds after a warm-up, the rows cut off again after each
pass), and what one more verified position costs against a one-token step, as
models/verify_cost.py measures it at its 256 tokens. The prompt: the standard library's
argparse.py and typing.py, read on this machine. Not a test.
python docs/results/attention-kv-major/passes.py MODEL 256,1024,2048,4096"""
import json
import sys
import sysconfig
from pathlib import Path

from dyncomplete.models import load
from dyncomplete.models.verify_cost import pass_times, position_cost

model = load(sys.argv[1], dtype="auto", device="cpu", quant="int4", progress=lambda m: None)
stdlib = Path(sysconfig.get_paths()["stdlib"])
ids = model.tokenizer("".join((stdlib / f).read_text() for f in ("argparse.py", "typing.py")))["input_ids"]
result = {}
for cached in [int(c) for c in sys.argv[2].split(",")]:
    t = pass_times(model, ids[: cached + 16], cached, [1, 2, 4, 8, 16], 7)
    result[cached] = {f"{k} rows ms": round(v * 1e3, 2) for k, v in t.items()}
    result[cached]["position cost"] = round(position_cost(t, 8), 3)
print(json.dumps(result))
