"""An int4 or int8 product by rows, Qwen2.5-Coder-0.5B's shapes, with decode.c as it is (AVX-512
VNNI) and with amx-tiles.patch (Intel AMX tiles from 4 rows on), alternating, 5 rounds, medians;
checks that both give the same bits. Not a test; needs a CPU with AMX.
python docs/results/amx-tiles/rows.py int4 1,2,4,6,8,12,16"""
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dyncomplete.models import native
from dyncomplete.models.weights import Linear

quant, rows_list = sys.argv[1], [int(r) for r in sys.argv[2].split(",")]
tmp = Path(tempfile.mkdtemp())
patched = tmp / "decode.c"
subprocess.run(["patch", "-s", "-o", str(patched), str(native.SOURCE), str(Path(__file__).with_name("amx-tiles.patch"))],
               check=True)
libs = {"vnni": native.compile_library(tmp / "vnni.so")}
native.SOURCE = patched
libs["amx"] = native.compile_library(tmp / "amx.so")
assert libs["amx"].amx_tiles() == 1, "no AMX here, or Linux did not lend its tile state"
torch.manual_seed(0)
shapes = {"gate_up": (9728, 896), "down": (896, 4864), "head": (151936, 896)}
lins = {k: Linear((torch.randn(s) * 0.05).bfloat16(), None, quant) for k, s in shapes.items()}


def seconds(lib, lin, x, out, work, n):
    start = time.perf_counter()
    for _ in range(n):
        lib.linear_bf16(ctypes.byref(lin.native), x.data_ptr(), x.shape[0], out.data_ptr(), work.data_ptr())
    return (time.perf_counter() - start) / n


for name, lin in lins.items():
    for rows in rows_list:
        x = torch.randn(rows, lin.in_features).bfloat16()
        work = torch.empty(libs["vnni"].linear_workspace_floats(lin.in_features, lin.out_features, rows))
        outs = {k: torch.empty(rows, lin.out_features, dtype=torch.bfloat16) for k in libs}
        times = {k: [] for k in libs}
        for _ in range(5):
            for k, lib in libs.items():
                times[k].append(seconds(lib, lin, x, outs[k], work, 3 if name == "head" else 30))
        v, a = (statistics.median(times[k]) * 1e3 for k in ("vnni", "amx"))
        print(f"{quant} {name:8s} rows {rows:2d}: vnni {v:7.3f} ms  amx {a:7.3f} ms  amx/vnni {a / v:.2f}  "
              f"same bits {torch.equal(outs['amx'], outs['vnni'])}", flush=True)
