"""How much of a one-token decode step is Python: `LayeredModel.forward` timed whole and its calls
into decode.c timed alone, over 200 steps after 480 cached tokens, with `FastEngine.chains` off (the
general path: step context, embedding, `run_native`, then `final_logits`) and on (`forward_chain`, one call of `forward_chains`).
The general path's final norm and head call is timed apart too (0 in forward_chain, whose one
call holds them), and so is the caller's own work (the token's tensor, the greedy choice).
python docs/results/chain-step/python_share.py MODEL"""
import sys
import time

import torch

from dyncomplete.bench.speed import PROMPT_FILE
from dyncomplete.engine.sampling import greedy_index
from dyncomplete.models import load
from dyncomplete.models.native import bindings

torch.set_num_threads(2)
model = load(sys.argv[1], quant="auto", progress=lambda m: None)
ids = model.tokenizer(PROMPT_FILE.read_text(), add_special_tokens=False).input_ids[:480]
spent = {"native": 0, "head": 0, "forward": 0, "caller": 0}
library = bindings.library()


class TimedLibrary:
    """decode.c's functions, the calls that run a step timed."""

    def __getattr__(self, name):
        function = getattr(library, name)
        if name not in ("layers_forward", "final_logits", "forward_chains"):
            return function

        def timed(*args):
            start = time.perf_counter_ns()
            out = function(*args)
            spent["native"] += time.perf_counter_ns() - start
            if name == "final_logits":
                spent["head"] += time.perf_counter_ns() - start
            return out
        return timed


bindings.library = TimedLibrary


def steps(n: int) -> None:
    cache = model.new_cache()
    tokens = [greedy_index(model.forward(torch.tensor(ids), cache)[0, -1])]
    for key in spent:
        spent[key] = 0
    for k in range(n):
        a = time.perf_counter_ns()
        token = torch.tensor(tokens[-1:])
        b = time.perf_counter_ns()
        logits = model.forward(token, cache, start=len(ids) + k)[0, -1]
        c = time.perf_counter_ns()
        tokens.append(greedy_index(logits))
        spent["caller"] += b - a + time.perf_counter_ns() - c
        spent["forward"] += c - b


with torch.inference_mode():
    for chains in (False, True, False, True):
        model.engines["fast"].chains = chains
        steps(30)
        steps(200)
        us = {key: value / 200 / 1000 for key, value in spent.items()}
        print(f"{sys.argv[1]} {'forward_chain' if chains else 'general path '}: forward {us['forward']:7.1f} us, "
              f"in decode.c {us['native']:7.1f} us (final norm and head {us['head']:5.1f} us), "
              f"Python in forward {us['forward'] - us['native']:6.1f} us, "
              f"caller {us['caller']:5.1f} us", flush=True)
