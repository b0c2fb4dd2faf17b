"""What one more verified position costs, relative to a one-token decode step, for this model on
this machine: measured, not assumed.

Draft lengths trade expected accepted tokens against the work of verifying them, and that work
depends on the weight format: plain bfloat16 products are bound by reading the weights (8 rows
cost about 1.15x one row on the CPU), the int8/int4 weight-only kernels are bound by compute
(8 rows about 3x one row). A draft length that pays in one format wastes time in another.
Measured once per (CPU, model, engine, weights, dtype, threads) and cached.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..paths import machine_measurement
from .native import source_digest


def native_kernels(model) -> str:
    """Which kernels decode `model` (their cost is what is measured): the native library's source
    digest for int4 weights, PyTorch's otherwise."""
    return "native-" + source_digest()[:8] if getattr(model, "quant", "none") == "int4" else "torch"

POSITIONS = 8  # the verification pass measured: this many positions at once
CONTEXT = 256  # tokens already in the cache, a typical completion prompt's order of size
FLOOR = 0.01  # never treat an extra position as free


@torch.inference_mode()
def measure_verify_cost(model, positions: int = POSITIONS, repeats: int = 7) -> float:
    """(time of a `positions`-token pass - time of a one-token pass) / (positions - 1), over the
    one-token time; the medians of `repeats` alternating runs, after one warm-up of each."""
    ids = torch.arange(CONTEXT + positions) % min(model.vocab_size, 1000) + 10
    cache = model.new_cache()
    model.forward(ids[:CONTEXT], cache)

    def timed(k: int) -> float:
        cache.crop(CONTEXT)
        start = time.perf_counter()
        model.forward(ids[CONTEXT : CONTEXT + k], cache, last_only=False)
        return time.perf_counter() - start

    timed(1), timed(positions)
    one, many = [], []
    for _ in range(repeats):
        one.append(timed(1))
        many.append(timed(positions))
    t1, tk = statistics.median(one), statistics.median(many)
    return max(FLOOR, (tk - t1) / (positions - 1) / t1)


def verify_cost(model) -> float:
    """The measured cost of one extra verified position for `model` (cached per machine)."""
    key = (f"{model.name}|{model.engine}|{model.quant}|{str(model.dtype).removeprefix('torch.')}|"
           f"{model.device.type}|{torch.get_num_threads()} threads|{native_kernels(model)}")
    return machine_measurement("verify_cost.json", key, lambda: round(measure_verify_cost(model), 4))
