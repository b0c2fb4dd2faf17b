"""Verification passes (bench.speed's verify_passes) with AMX tiles on and off, alternating, one process. Needs amx-int8.patch applied (`amx_tiles`)."""
import json, sys, torch
from dyncomplete.models import load, native
from dyncomplete.bench.speed import verify_passes
torch.set_num_threads(2)
m = load(sys.argv[1], quant="auto", progress=lambda *a: None)
lib = native.library()
for rnd in range(2):
    for amx in (0, 1):
        lib.amx_tiles(amx)
        r = verify_passes(m, [1, 8, 16, 32], runs=7)
        print(rnd, "amx" if amx else "vnni", json.dumps(r))
