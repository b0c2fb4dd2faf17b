"""What one more verified position costs, relative to a one-token decode step, for this model on
this machine: measured, not assumed.

Draft lengths trade expected accepted tokens against the work of verifying them, and that work
depends on the weight format: plain bfloat16 products are bound by reading the weights (8 rows
cost about 1.15x one row on the CPU), the native int8/int4 kernels are bound by compute
(8 rows about 3x one row). A draft length that pays in one format wastes time in another.
Measured once per (CPU, model, engine, weights, dtype, threads) and cached.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..paths import machine_measurement
from .native import source_digest
from .weights import BITS


def native_kernels(model) -> str:
    """Which kernels decode `model` (their cost is what is measured): the native library's source
    digest for int4/int8 weights, PyTorch's otherwise."""
    return "native-" + source_digest()[:8] if getattr(model, "quant", "none") in BITS else "torch"

POSITIONS = 8  # the verification pass measured: this many positions at once
CONTEXT = 256  # tokens already in the cache, a typical completion prompt's order of size
FLOOR = 0.01  # never treat an extra position as free


@torch.inference_mode()
def pass_times(model, ids, prompt_tokens: int, rows: list[int], runs: int) -> dict[int, float]:
    """Median seconds of one pass over k new positions after the first `prompt_tokens` of `ids`
    (a one-token step for k = 1, a verification pass of k - 1 drafted tokens otherwise), for each
    k in `rows`: `runs` rounds through every k in turn, after one round of warm-up."""
    ids = torch.as_tensor(ids)
    cache = model.new_cache()
    model.forward(ids[:prompt_tokens], cache)
    times: dict[int, list[float]] = {k: [] for k in rows}
    for round_ in range(runs + 1):
        for k in rows:
            cache.crop(prompt_tokens)
            start = time.perf_counter()
            model.forward(ids[prompt_tokens : prompt_tokens + k], cache, last_only=False)
            if round_:
                times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def position_cost(times: dict[int, float], positions: int) -> float:
    """(time of a `positions`-token pass - time of a one-token pass) / (positions - 1), over the
    one-token time, from `pass_times`."""
    return (times[positions] - times[1]) / (positions - 1) / times[1]


def measure_verify_cost(model, positions: int = POSITIONS, repeats: int = 7) -> float:
    """`position_cost` at CONTEXT cached tokens, from the medians of `repeats` alternating runs,
    after one warm-up of each."""
    ids = torch.arange(CONTEXT + positions) % min(model.vocab_size - 10, 1000) + 10  # ids 10.. within the vocabulary
    return max(FLOOR, position_cost(pass_times(model, ids, CONTEXT, [1, positions], repeats), positions))


def verify_cost(model) -> float:
    """The measured cost of one extra verified position for `model` (cached per machine)."""
    key = (f"{model.name}|{model.engine}|{model.quant}|{str(model.dtype).removeprefix('torch.')}|"
           f"{model.device.type}|{torch.get_num_threads()} threads|{native_kernels(model)}")
    return machine_measurement("verify_cost.json", key, lambda: round(measure_verify_cost(model), 4))
