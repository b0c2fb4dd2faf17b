"""The weight formats of the fast engine: plain, int8 and int4 linear layers.

int8 is per output channel (symmetric) with PyTorch's CPU weight-only kernel; int4 is in groups
of `INT4_GROUP` input features (asymmetric, scale and zero point per group) with the native
kernels of `native/decode.c`. Both give each row the same result at any row count (checked by
the tests), so verification passes stay identical to one-token decoding. Inputs of more than
`SHORT_QUERY` rows (prompts) multiply by the plain `weight` instead, where GEMM kernels win (the
fast engine stores the dequantized weights there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .attention import SHORT_QUERY
from .invariant import BLOCK, split_k_matmul
from .native import bindings

QUANTS = ("none", "int8", "int4")
INT4_GROUP = native.GROUP  # input features per int4 scale/zero pair (GGUF's Q4_0/Q4_1 block)


def quantize_int8(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (int8 weight (N, K), scales (N,) in `dtype`)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(dtype)
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(weight: torch.Tensor, dtype: torch.dtype, group: int = INT4_GROUP):
    """Asymmetric int4 in groups of `group` input features, as `_weight_int4pack_mm_for_cpu` reads
    it: w ~ (q - 8) * scale + zero with q in 0..15. Returns (levels (N, K) int32, scales and zeros
    (K / group, N, 2) in `dtype`)."""
    n, k = weight.shape
    if k % group:
        raise ValueError(f"int4 needs input features divisible by {group}, got {k}")
    w = weight.detach().float().reshape(n, k // group, group)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp_min(1e-8).to(dtype).float()
    zeros = (lo + 8 * scales).to(dtype).float()
    q = torch.round((w - zeros[..., None]) / scales[..., None] + 8).clamp_(0, 15).to(torch.int32)
    packed_sz = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return q.reshape(n, k), packed_sz


class Linear:
    """y = x W^T (+ b) for x (..., K): plain weights (the model dtype), int8 or int4.

    Plain weights reduce over at most BLOCK inputs per product in low precision on the CPU (as
    `invariant.split_k_linear` does), so a row's result never depends on the rows beside it."""

    __slots__ = ("weight", "bias", "quant", "split", "wt", "qweight", "scales", "group", "in_features",
                 "out_features", "levels", "native")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, quant: str = "none",
                 invariant: bool = False, group: int = INT4_GROUP, packed: tuple | None = None):
        """`packed`: int4 blocks as `native.pack_int4` made them from this weight (a snapshot's,
        `packed.py`); `weight` then already holds their dequantized values."""
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias, self.quant, self.group = weight, bias, quant, group
        self.split = invariant and self.in_features > BLOCK
        self.wt = weight.t()
        self.qweight = self.scales = self.levels = self.native = None
        if quant == "int8":
            self.qweight, self.scales = quantize_int8(weight, weight.dtype)
        elif quant == "int4":
            if weight.dtype != torch.bfloat16 or group != native.GROUP:
                raise ValueError(f"int4 weights run in bfloat16 with groups of {native.GROUP}, not {weight.dtype}")
            native.library()  # builds the kernels now, or says why it cannot
            if packed is None:
                self.levels, self.scales = quantize_int4(weight, weight.dtype, group)  # levels: until `dequantized` ran
                packed = native.pack_int4(self.levels, self.scales)
            self.qweight = packed
            self.native = native.linear_struct(self.qweight, bias, self.out_features)
        elif quant != "none":
            raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")

    def dequantized(self) -> torch.Tensor:
        """The weight the quantized kernel multiplies by, in the model dtype (plain: the weight)."""
        dtype = self.weight.dtype
        if self.quant == "int8":
            return (self.qweight.float() * self.scales.float()[:, None]).to(dtype)
        if self.quant == "int4":
            levels = self.levels.float().reshape(self.out_features, -1, self.group)
            sz = self.scales.float().transpose(0, 1)  # (N, K / group, 2)
            return ((levels - 8) * sz[..., :1] + sz[..., 1:]).reshape(self.out_features, -1).to(dtype)
        return self.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        quant = self.quant
        if quant == "none" or x.numel() > SHORT_QUERY * self.in_features:
            if not self.split:
                return F.linear(x, self.weight, self.bias)
            out = split_k_matmul(x, self.wt)
            return out if self.bias is None else out + self.bias
        rows = x.reshape(-1, self.in_features)
        if quant == "int4":
            return bindings.linear(self.native, rows).view(*x.shape[:-1], self.out_features)  # + bias
        out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def weight_bytes(self) -> int:
        """Bytes read from memory by one product (weights, scales, bias)."""
        if self.quant == "none":
            n = self.weight.numel() * self.weight.element_size()
        elif self.quant == "int8":
            n = self.qweight.numel() + self.scales.numel() * self.scales.element_size()
        else:  # the packed blocks, padded to whole blocks of output features as decode.c reads them
            n = sum(t.numel() * t.element_size() for t in self.qweight)
        return n + (self.bias.numel() * self.bias.element_size() if self.bias is not None else 0)
