"""Energy of a piece of work, with where the number comes from.

    meter = open_meter("cpu")            # or "cuda", "cuda:1"
    with meter.measure() as m:
        ...                              # the work
    m.joules, m.source, m.seconds        # source: "nvml" | "rapl" | "estimate"

`open_meter` picks the best source the machine offers: NVML's energy counter on a GPU, RAPL
counters where /sys/class/powercap is readable on a CPU, and otherwise an estimate from the
process's CPU time (formula in `m.formula`). RAPL and NVML measure the whole package or board,
so concurrent work elsewhere on the machine is counted too; the estimate counts every thread of
this process. Work per token, independent of the machine, is `work.compute_per_token`.
"""

from __future__ import annotations

from .meters import Measurement, Meter, open_meter
from .work import compute_per_token, decision_per_token

__all__ = ["Measurement", "Meter", "open_meter", "compute_per_token", "decision_per_token"]
