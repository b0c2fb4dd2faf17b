"""Memory bandwidth: what this machine can move (a copy benchmark, run once and cached; and what
reading alone reaches), and what a decode achieves: the weight bytes one decode step reads times
tokens per second, as gpt-fast reports it. A CPU decode of a small model is bound by reading its
weights, so the share of the machine's bandwidth a method reaches says how much is left to gain."""

from __future__ import annotations

import statistics
import time

import torch

from ..paths import machine_measurement

COPY_MB = 256


def _median_seconds(run, repeats: int) -> float:
    run()  # touch the pages first
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_copy_bandwidth(megabytes: int = COPY_MB, repeats: int = 10) -> float:
    """GB/s of a large tensor copy (bytes read plus bytes written), the median of `repeats`."""
    src = torch.ones(megabytes * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / _median_seconds(lambda: dst.copy_(src), repeats) / 1e9


def measure_read_bandwidth(megabytes: int = COPY_MB, repeats: int = 10) -> float:
    """GB/s of a sum over a large tensor (bytes read only), the median of `repeats`: the bound of a
    decode, which reads its weights and writes almost nothing. A copy also writes, and reading
    alone can go faster than its count of both (a decode on AMD Zen 3 went past it)."""
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    return 4 * src.numel() / _median_seconds(src.sum, repeats) / 1e9


def machine_bandwidth() -> float:
    """This machine's copy bandwidth (GB/s) at the current thread count, measured once and cached."""
    return machine_measurement("bandwidth.json", f"{torch.get_num_threads()} threads",
                               lambda: round(measure_copy_bandwidth(), 2))
