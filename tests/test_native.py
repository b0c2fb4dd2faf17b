"""The native decode kernels (models/native): the scalar build (no AVX2) and the AVX2 build (no
AVX-512) compute the same products as the one for this CPU, bit for bit, each row independent of the
rows beside it, and a machine without a compiler gets a clear refusal instead of int4 weights; a
thread other than the loading one runs the kernels as fast."""

import ctypes
import statistics
import threading
import time

import pytest
import torch

from dyncomplete.models import native
from dyncomplete.models.weights import Linear

BUILDS = {"scalar": "x86-64", "avx2": "x86-64-v3"}  # -march of the kernels' portable loops and of their AVX2 version


def cpu_has(flag: str) -> bool:
    return any(line.startswith("flags") and f" {flag} " in f"{line} " for line in open("/proc/cpuinfo"))


def product(lib, lin: Linear, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], lin.out_features, dtype=torch.bfloat16)
    work = torch.empty(lib.linear_workspace_floats(lin.in_features, lin.out_features, x.shape[0]))
    lib.linear_bf16(ctypes.byref(lin.native), x.data_ptr(), x.shape[0], out.data_ptr(), work.data_ptr())
    return out


@pytest.fixture(scope="module", params=list(BUILDS))
def portable(request, tmp_path_factory):
    if request.param == "avx2" and not (cpu_has("avx2") and cpu_has("fma")):
        pytest.skip("this CPU has no AVX2")
    flags = [f if f != "-march=native" else f"-march={BUILDS[request.param]}" for f in native.FLAGS]
    return native.compile_library(tmp_path_factory.mktemp("native") / f"{request.param}.so", flags)


@pytest.mark.parametrize("shape", [(100, 96), (576, 1536), (1001, 864)])
def test_portable_builds_compute_the_same_products_row_by_row(portable, shape):
    g = torch.Generator().manual_seed(shape[1])
    lin = Linear((torch.randn(shape, generator=g) * 0.05).bfloat16(), torch.randn(shape[0]).bfloat16(), "int4")
    x = torch.randn(7, shape[1], generator=g).bfloat16()
    here = product(native.library(), lin, x)
    anywhere = product(portable, lin, x)
    assert torch.equal(anywhere, here)  # the same floating-point operations in the same order
    alone = [product(portable, lin, x[r : r + 1].contiguous())[0] for r in range(7)]
    assert all(torch.equal(anywhere[r], alone[r]) for r in range(7))
    # the product the kernels compute is the dequantized weight times the input
    ref = x.float() @ lin.dequantized().float().t() + lin.bias.float()
    torch.testing.assert_close(here.float(), ref, atol=0.05, rtol=0.02)


def test_without_a_compiler_int4_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(native.NativeUnavailable, match="apt-get install gcc.*--quant none"):
        native.compile_library(tmp_path / "k.so")


def test_a_thread_that_did_not_load_runs_the_kernels_as_fast_as_the_loading_one():
    """The server loads in its main thread and decodes in a worker thread; `load` ends with
    `release_thread_pool` (without it the worker's products took about three times as long)."""
    lin = Linear(torch.randn(4864, 896, dtype=torch.bfloat16), None, "int4")
    x = torch.randn(1, 896, dtype=torch.bfloat16)

    def per_call(out: list) -> None:
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(300):
                lin(x)
            out.append((time.perf_counter() - start) / 300)

    here, there = [], []
    per_call(here)
    native.release_thread_pool()
    worker = threading.Thread(target=per_call, args=(there,))
    worker.start()
    worker.join()
    assert statistics.median(there) < 1.5 * statistics.median(here), (here, there)
