"""Energy meters: NVML (GPU board), RAPL (CPU package), or a CPU-time estimate.

Each meter reads a cumulative counter before and after the work; the estimate's "counter" is the
process's CPU time (all threads) times a fixed figure per busy core.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Power of one fully busy server core: about TDP / cores of current server CPUs (AMD EPYC 9654:
# 360 W / 96 cores = 3.75 W; Intel Xeon 8480+: 350 W / 56 = 6.25 W). Uncore, memory and idle
# power are left out, so the estimate is a lower bound of the wall-socket energy.
WATTS_PER_CORE = float(os.environ.get("DYNCOMPLETE_WATTS_PER_CORE", "5.0"))
POWERCAP = Path("/sys/class/powercap")


@dataclass
class Measurement:
    source: str
    formula: str = ""
    seconds: float = 0.0
    joules: float = 0.0
    cpu_seconds: float = 0.0


class Meter:
    """Base: subclasses return a cumulative counter state and the joules between two states."""

    source = ""
    formula = ""

    def _state(self):
        raise NotImplementedError

    def _joules(self, before, after) -> float:
        raise NotImplementedError

    @contextmanager
    def measure(self):
        m = Measurement(self.source, self.formula)
        wall, cpu, state = time.perf_counter(), time.process_time(), self._state()
        try:
            yield m
        finally:
            end = self._state()
            m.seconds = time.perf_counter() - wall
            m.cpu_seconds = time.process_time() - cpu
            m.joules = self._joules(state, end)


class EstimateMeter(Meter):
    source = "estimate"

    def __init__(self, watts_per_core: float = WATTS_PER_CORE):
        self.watts_per_core = watts_per_core
        self.formula = f"process CPU seconds x {watts_per_core:g} W per core"

    def _state(self):
        return time.process_time()

    def _joules(self, before, after) -> float:
        return (after - before) * self.watts_per_core


class RaplMeter(Meter):
    """Sum of the top-level RAPL package zones (intel-rapl:N; AMD exposes the same names)."""

    source = "rapl"
    formula = "RAPL package energy counters (whole CPU package, all processes)"

    def __init__(self, root: Path = POWERCAP):
        self.zones = [z for z in sorted(root.glob("intel-rapl:*")) if re.fullmatch(r"intel-rapl:\d+", z.name)]
        if not self.zones:
            raise OSError(f"no RAPL package zones under {root}")
        self.ranges = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]
        self._state()  # raises PermissionError where the counters are not readable

    def _state(self):
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def _joules(self, before, after) -> float:
        total = 0
        for b, a, r in zip(before, after, self.ranges):
            total += a - b if a >= b else a + r - b  # the counter wrapped around once
        return total / 1e6


class NvmlMeter(Meter):
    """NVML's total-energy counter of one GPU (Volta and newer), in millijoules."""

    source = "nvml"

    def __init__(self, index: int = 0):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.formula = f"NVML total energy counter of GPU {index} (whole board, all processes)"
        self._state()

    def _state(self):
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def _joules(self, before, after) -> float:
        return (after - before) / 1e3


def open_meter(device: str = "cpu") -> Meter:
    """The best meter for `device` ("cpu", "cuda", "cuda:N"): NVML on a GPU, RAPL on a CPU where
    readable, otherwise the CPU-time estimate."""
    kind, _, index = str(device).partition(":")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r} for an energy meter: use cpu or cuda[:N]")
    try:
        if kind == "cuda":
            return NvmlMeter(int(index or 0))
        return RaplMeter()
    except Exception:  # no driver, no counters, no permission: fall back to the labelled estimate
        return EstimateMeter()
