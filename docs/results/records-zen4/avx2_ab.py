"""The AVX2 build (-march=x86-64-v3) of decode.c at git revision BEFORE (levels, scales and zeros in
three arrays) against the working tree's (one record a group): one int4 product of
Qwen2.5-Coder-0.5B's widths, 1 and 8 rows, 15 alternating rounds, medians; the same bits checked.
Run on an AVX-512 CPU it is only a stand-in for a Zen 3.
OMP_NUM_THREADS=2 python docs/results/records-zen4/avx2_ab.py d174b50"""
import ctypes, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch
from dyncomplete.models import native
from dyncomplete.models.weights import quantize_levels

class OldLinear(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("zeros", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("out", ctypes.c_int), ("in_", ctypes.c_int), ("bits", ctypes.c_int)]

FLAGS = [f if f != "-march=native" else "-march=x86-64-v3" for f in native.FLAGS]  # the tests' AVX2 build
build = Path(tempfile.mkdtemp())
sources = {"old": subprocess.run(["git", "show", f"{sys.argv[1]}:dyncomplete/models/native/decode.c"], check=True,
                                 capture_output=True, text=True).stdout,
           "new": native.SOURCE.read_text()}
libs = {}
for v, text in sources.items():
    (build / f"{v}.c").write_text(text)
    subprocess.run(["cc", *FLAGS, str(build / f"{v}.c"), "-o", str(build / f"{v}.so"), "-lm"], check=True)
    lib = ctypes.CDLL(str(build / f"{v}.so"))
    lib.linear_workspace_floats.argtypes, lib.linear_workspace_floats.restype = [ctypes.c_int] * 3, ctypes.c_long
    lib.linear_bf16.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] + [ctypes.c_void_p] * 2
    libs[v] = lib
torch.manual_seed(0)
shapes = {"gate_up 896->9728": (9728, 896), "down 4864->896": (896, 4864), "head 896->151936": (151936, 896)}
for name, (n, k) in shapes.items():
    w = (torch.randn(n, k) * 0.05).bfloat16()
    levels, sz = quantize_levels(w, torch.bfloat16, 4)
    rec = native.pack_levels(levels, sz, 4)
    groups = k // 32
    q_old = rec[..., :256].contiguous()
    words = rec[..., 256:].contiguous().view(torch.bfloat16).reshape(rec.shape[0], groups, 16, 2)
    s_old, z_old = words[..., 0].contiguous(), words[..., 1].contiguous()
    structs = {"old": OldLinear(q_old.data_ptr(), s_old.data_ptr(), z_old.data_ptr(), None, n, k, 4),
               "new": native.Linear(rec.data_ptr(), None, n, k, 4)}
    for rows in (1, 8):
        x = torch.randn(rows, k).bfloat16()
        outs, times = {}, {"old": [], "new": []}
        for rnd in range(15):
            for v in ("old", "new"):
                lib = libs[v]
                out = torch.empty(rows, n, dtype=torch.bfloat16)
                work = torch.empty(lib.linear_workspace_floats(k, n, rows))
                reps = max(1, int(2e8 // (n * k)))
                t = time.perf_counter()
                for _ in range(reps):
                    lib.linear_bf16(ctypes.byref(structs[v]), x.data_ptr(), rows, out.data_ptr(), work.data_ptr())
                times[v].append((time.perf_counter() - t) / reps)
                outs[v] = out
        same = torch.equal(outs["old"], outs["new"])
        ratios = sorted(a / b for a, b in zip(times["new"], times["old"]))
        print(f"{name}, {rows} rows: old {statistics.median(times['old']) * 1e3:.3f} ms, new {statistics.median(times['new']) * 1e3:.3f} ms, "
              f"new/old in a round median {statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}), same bits {same}", flush=True)
