"""The fast engine's native decode kernels (`decode.c`): int4 and int8 products and one whole
decoder layer per call for short queries.

The C file is compiled on first use for this CPU (`cc -O3 -march=native -fopenmp`) into the
cache, one library per (source, CPU); `bindings.py` calls it through ctypes with the data pointers
of PyTorch tensors. The library links the OpenMP runtime PyTorch has loaded, so both
share one pool of threads. Without a C compiler, `library()` raises `NativeUnavailable` and
int4 and int8 weights are refused with that message.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from ...paths import cache_root, cpu_identity

SOURCE = Path(__file__).with_name("decode.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
GROUP = 32  # input features per scale/zero pair (decode.c's GROUP)
BLOCK = 16  # output features per block of packed weights (decode.c's BLOCK)


class NativeUnavailable(ValueError):
    """The native kernels cannot be built on this machine (no C compiler, or it failed)."""


class Linear(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("out", ctypes.c_int), ("in_", ctypes.c_int),
                ("bits", ctypes.c_int)]


class Layer(ctypes.Structure):
    _fields_ = [("in_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv", Linear), ("o", Linear),
                ("gate_up", Linear), ("down", Linear)]


class Dims(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int), ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("intermediate", ctypes.c_int), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float)]


class Dense(ctypes.Structure):
    _fields_ = [("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("out", ctypes.c_int), ("in_", ctypes.c_int)]


MAX_DENSE = 4  # dense layers of an exit network (decode.c's MAX_DENSE)
MAX_WIDTH = 4096  # widest features or dense layer of one (decode.c's MAX_WIDTH)
MAX_SEGMENTS = 256  # sequences in one batched call (decode.c's MAX_SEGMENTS)
FEATURES = {"final_norm": 0, "unit_rms_depth": 1}  # what an exit network reads (decode.c's FEATURES_*)
ACTIVATIONS = {"relu": 0, "tanh": 1}


class ExitNet(ctypes.Structure):
    _fields_ = [("features", ctypes.c_int), ("activation", ctypes.c_int), ("n", ctypes.c_int),
                ("dense", Dense * MAX_DENSE)]


class ExitPlan(ctypes.Structure):
    _fields_ = [("checks", ctypes.c_int), ("layers", ctypes.c_void_p), ("nets", ctypes.c_void_p),
                ("threshold", ctypes.c_float), ("final_norm", ctypes.c_void_p)]


def _compile(target: Path, flags: list[str]) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NativeUnavailable("int4 and int8 weights need a C compiler for the native kernels "
                                "(apt-get install gcc), or use --quant none")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        try:
            done = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built), "-lm"], capture_output=True,
                                  text=True)
        except OSError as exc:
            raise NativeUnavailable(f"cannot run the C compiler {compiler!r} ({exc.strerror}): int4 and int8 weights "
                                    "need one for the native kernels (apt-get install gcc), or use --quant none") from exc
        if done.returncode:
            raise NativeUnavailable(f"compiling {SOURCE.name} failed: {done.stderr.strip()[-500:]}")
        os.replace(built, target)  # atomic: a concurrent process sees the old state or the whole file


def source_digest() -> str:
    """SHA-256 of the kernels' source and compiler flags: what a measurement of them depends on."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()


def compile_library(target: Path, flags: list[str] = FLAGS) -> ctypes.CDLL:
    """decode.c compiled with `flags` into `target` (unless that file exists), loaded, with the
    functions' signatures declared."""
    if not target.is_file():
        _compile(target, flags)
    lib = ctypes.CDLL(str(target))
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.workspace_floats.argtypes, lib.workspace_floats.restype = [ctypes.POINTER(Dims), i32], ctypes.c_long
    lib.layers_forward.argtypes = [ctypes.POINTER(Dims), ptr, i32, ptr, ptr, i32, i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.layers_forward.restype = None
    lib.layers_forward_batch.argtypes = [ctypes.POINTER(Dims), ptr, i32, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, ptr,
                                         ptr, ptr]
    lib.layers_forward_batch.restype = None
    lib.layers_project_kv.argtypes = [ctypes.POINTER(Dims), ptr, i32, ptr, i32, i32, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.layers_project_kv.restype = None
    lib.layers_forward_exit.argtypes = [ctypes.POINTER(Dims), ptr, i32, ptr, i32, i32, ptr, ctypes.POINTER(ExitPlan),
                                        i32, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.layers_forward_exit.restype = i32
    lib.exit_probability.argtypes = [ctypes.POINTER(Dims), ctypes.POINTER(ExitNet), ptr, ptr, i32, i32]
    lib.exit_probability.restype = ctypes.c_float
    lib.linear_workspace_floats.argtypes, lib.linear_workspace_floats.restype = [i32, i32, i32], ctypes.c_long
    lib.linear_bf16.argtypes = [ctypes.POINTER(Linear), ptr, i32, ptr, ptr]
    lib.linear_bf16.restype = None
    lib.final_norm_bf16.argtypes = [ctypes.POINTER(Dims), ptr, ptr, i32, ptr]
    lib.final_norm_bf16.restype = None
    lib.logits_workspace_floats.argtypes, lib.logits_workspace_floats.restype = [i32, i32], ctypes.c_long
    lib.final_logits.argtypes = [ctypes.POINTER(Dims), ptr, ctypes.POINTER(Linear), ptr, i32, ptr, ptr]
    lib.final_logits.restype = None
    lib.forward_chains.argtypes = [ctypes.POINTER(Dims), ptr, i32, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr,
                                   ptr, ptr, ptr, ptr, ptr, ptr, ctypes.POINTER(Linear), i32, ptr, ptr, ptr, ptr]
    lib.forward_chains.restype = None
    lib.rotate_keys_bf16.argtypes = [i32, i32, i32, i32, ptr, ptr, i32, ptr, ptr, i32, ptr, ptr]
    lib.rotate_keys_bf16.restype = None
    lib.omp_pause_resource_all.argtypes, lib.omp_pause_resource_all.restype = [i32], i32  # from OpenMP's runtime
    lib.omp_set_num_threads.argtypes, lib.omp_set_num_threads.restype = [i32], None
    return lib


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled kernels for this CPU, built into the cache on first use."""
    digest = hashlib.sha256((source_digest() + cpu_identity()).encode()).hexdigest()[:16]
    return compile_library(cache_root() / "native" / f"decode-{digest}.so")


def release_thread_pool() -> None:
    """Free the calling thread's idle OpenMP threads (OpenMP 5's `omp_pause_resource_all`, soft).

    libgomp keeps idle threads spinning, for a quick start of the next parallel region, only while
    the process holds no more OpenMP threads than CPUs. The server loads its model in one thread
    and decodes in another: the loading thread's idle pool then counts, each of the decode step's
    short parallel regions wakes sleeping threads instead, and int4 decoding ran at half speed.
    A pool comes back when its thread runs a region again. Nothing to do where the kernels were
    never loaded."""
    if loaded():
        library().omp_pause_resource_all(1)  # omp_pause_soft


def loaded() -> bool:
    """Whether this process has the kernels already (asking runs no compiler)."""
    return library.cache_info().currsize > 0


def keep_thread_serial() -> None:
    """Run the calling thread's OpenMP regions on that thread alone (PyTorch's too: the process
    has one OpenMP runtime, PyTorch's libgomp). A server's slot threads do small tensor work
    beside the model thread; their own pools of threads would count against the CPU count as
    `release_thread_pool` explains, and batched decode steps ran at a third of their speed."""
    torch.get_num_threads()  # PyTorch sets a thread's OpenMP count at its first call: before ours
    library().omp_set_num_threads(1)


def available() -> bool:
    """Whether the native kernels can run here (built now if they were not)."""
    try:
        library()
    except NativeUnavailable:
        return False
    return True


def pack_levels(levels: torch.Tensor, scales_zeros: torch.Tensor, bits: int) -> torch.Tensor:
    """decode.c's weights from `weights.quantize_levels`' output (levels (N, K), scales and zeros
    (K / GROUP, N, 2) bf16), in blocks of BLOCK output features (N padded with zero scales): uint8
    records (blocks, K / GROUP, levels + 4 * BLOCK), one per group of a block, its levels
    - int4: (4, BLOCK, 4), byte [j, f, i] = level 4j + i of feature f (low nibble) and level
      16 + 4j + i (high nibble);
    - int8: (8, BLOCK, 4), byte [j, f, i] = level 4j + i;
    then each feature's scale and zero (bf16, in that order: a little-endian 32-bit word each)."""
    n, k = levels.shape
    pad = -n % BLOCK
    q = F.pad(levels.to(torch.uint8), (0, 0, 0, pad)).reshape(-1, BLOCK, k // GROUP, 8, 4)  # b f g j i
    if bits == 4:
        q = q[:, :, :, :4] | (q[:, :, :, 4:] << 4)  # levels 16.. in the high nibbles
    blocks = q.shape[0]
    q = q.permute(0, 2, 3, 1, 4).reshape(blocks, k // GROUP, -1)  # b g (j f i)
    sz = F.pad(scales_zeros, (0, 0, 0, pad)).reshape(k // GROUP, -1, BLOCK, 2).transpose(0, 1)  # b g f 2
    words = sz.contiguous().view(torch.uint8).reshape(blocks, k // GROUP, 4 * BLOCK)
    return torch.cat([q, words], dim=-1)


def linear_struct(records: torch.Tensor, bias: torch.Tensor | None, out_features: int, bits: int) -> Linear:
    return Linear(records.data_ptr(), bias.data_ptr() if bias is not None else None, out_features,
                  records.shape[1] * GROUP, bits)
