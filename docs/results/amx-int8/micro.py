"""One int4 product of Qwen2.5-Coder-0.5B's shapes (gate_up, down) on `rows` rows, AMX tiles off and on (`python3 micro.py ROWS`). Needs amx-int8.patch applied (`amx_tiles`)."""
import ctypes, sys, time, torch
from pathlib import Path
from dyncomplete.models import native
from dyncomplete.models.weights import Linear
torch.set_num_threads(2)
lib = native.library()
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 128
for shape in [(9728, 896), (896, 4864)]:
    g = torch.Generator().manual_seed(0)
    lin = Linear((torch.randn(shape, generator=g) * 0.05).bfloat16(), None, "int4")
    x = torch.randn(rows, shape[1], generator=g).bfloat16()
    out = torch.empty(rows, shape[0], dtype=torch.bfloat16)
    for name, lib, amx in [("vnni", lib, 0), ("amx", lib, 1)]:
        lib.amx_tiles(amx)
        work = torch.empty(lib.linear_workspace_floats(shape[1], shape[0], rows))
        f = lambda: lib.linear_bf16(ctypes.byref(lin.native), x.data_ptr(), rows, out.data_ptr(), work.data_ptr())
        f(); ts = []
        for _ in range(5):
            t = time.perf_counter(); [f() for _ in range(10)]; ts.append((time.perf_counter() - t) / 10)
        t = sorted(ts)[2]
        print(f"{shape} rows {rows} {name}: {t*1e3:.2f} ms, {rows*shape[0]*shape[1]/t/1e9:.0f} GMAC/s")
