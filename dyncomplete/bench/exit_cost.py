"""What one native exit check costs against one decoder layer of the same model (int4).

    python -m dyncomplete.bench.exit_cost --model qwen2.5-coder-0.5b --policy classifier

Times decode.c's check (`exit_probability`: the policy's network on one hidden state) and one
layer for one token after a 480-token cache (`layers_forward`), each through the same ctypes path,
so both include one call's overhead; medians over runs of 2,000 calls. Bytes: the network's float32
weights against the layer's int4 weights with their scales.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ..methods import make_method
from ..models import load

CALLS = 2000
CACHE = 480


def per_call_us(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(times)


@torch.inference_mode()
def measure(model_name: str, policy: str, runs: int) -> dict:
    model = load(model_name, quant="int4", progress=lambda m: None)
    engine = model.engines["fast"]
    exits = make_method(f"early-exit:{policy}@0.5", model).native
    if exits is None:
        raise SystemExit(f"{policy} decides in Python, not in decode.c")
    k = next(k for k, e in enumerate(exits.layers) if exits.nets[k].n)  # a check with a network
    e, net = exits.layers[k], exits.nets[k]
    hidden = torch.randn(model.hidden_size).to(model.dtype)
    check = per_call_us(lambda: exits.probability(engine.native.dims, e, hidden, engine.final_norm_weight,
                                                  model.num_layers), runs)
    cache = model.new_cache()
    model.forward(torch.randint(0, 1000, (CACHE,)), cache)
    ctx = model.context(torch.tensor([CACHE]))
    row = model.embed(torch.tensor([1]), ctx)

    def one_layer():
        model.run_layer(0, row, ctx, cache)
        cache.lengths[0] = CACHE  # the same position again

    layer = per_call_us(one_layer, runs)
    net_bytes = sum(4 * (dense.out * dense.in_ + dense.out) for dense in net.dense[: net.n])
    layer_bytes = engine.layers[0].weight_bytes()
    return {"model": model_name, "policy": policy, "check_us": round(check, 1), "layer_us": round(layer, 1),
            "check_bytes": net_bytes, "layer_bytes": layer_bytes, "calls": CALLS, "runs": runs,
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--policy", default="classifier", help="a policy decode.c decides: classifier or rl")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = measure(args.model, args.policy, args.runs)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['model']} {r['policy']}: one check {r['check_us']} us, {r['check_bytes'] / 1e3:.0f} kB; "
              f"one layer {r['layer_us']} us, {r['layer_bytes'] / 1e6:.2f} MB "
              f"({100 * r['check_us'] / r['layer_us']:.1f}% of its time, "
              f"{100 * r['check_bytes'] / r['layer_bytes']:.1f}% of its bytes); {r['threads']} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
