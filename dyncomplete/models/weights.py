"""The weight formats of the fast engine: plain, int8 and int4 linear layers.

int8 and int4 are in groups of `GROUP` input features (asymmetric: a scale and a zero point per
group, 256 or 16 levels) with the native kernels of `native/decode.c`. Both give each row the same
result at any row count (checked by the tests), so verification passes stay identical to
one-token decoding. Inputs of more than `SHORT_QUERY` rows (prompts) multiply by the plain
`weight` instead, where GEMM kernels win (the fast engine stores the dequantized weights there)
and `FastEngine.native_prompt` does not send them through decode.c.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .attention import SHORT_QUERY
from .invariant import BLOCK, split_k_matmul
from .native import bindings

QUANTS = ("none", "int8", "int4")
BITS = {"int8": 8, "int4": 4}  # the formats decode.c multiplies by: bits a level
GROUP = native.GROUP  # input features per scale/zero pair (GGUF's Q4_1/Q8_0 block)


def quantize_levels(weight: torch.Tensor, dtype: torch.dtype, bits: int):
    """Asymmetric quantization in groups of GROUP input features: w ~ (q - m) * scale + zero with q
    in 0..2m - 1, m = 2 ** (bits - 1) (int4: 0..15 around 8, as `_weight_int4pack_mm_for_cpu` reads
    it; int8: 0..255 around 128). Returns (levels (N, K) int32, scales and zeros (K / GROUP, N, 2)
    in `dtype`)."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int{bits} needs input features divisible by {GROUP}, got {k}")
    top, mid = 2**bits - 1, 2 ** (bits - 1)
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((hi - lo) / top).clamp_min(1e-8).to(dtype).float()
    zeros = (lo + mid * scales).to(dtype).float()
    q = torch.round((w - zeros[..., None]) / scales[..., None] + mid).clamp_(0, top).to(torch.int32)
    packed_sz = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return q.reshape(n, k), packed_sz


class Linear:
    """y = x W^T (+ b) for x (..., K): plain weights (the model dtype), int8 or int4 (`BITS`).

    Plain weights reduce over at most BLOCK inputs per product in low precision on the CPU (as
    `invariant.split_k_linear` does), so a row's result never depends on the rows beside it."""

    __slots__ = ("weight", "bias", "quant", "split", "wt", "qweight", "scales", "in_features", "out_features",
                 "levels", "native")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, quant: str = "none",
                 invariant: bool = False, packed: torch.Tensor | None = None):
        """`packed`: blocks as `native.pack_levels` made them from this weight (a snapshot's,
        `packed.py`); `weight` then already holds their dequantized values."""
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias, self.quant = weight, bias, quant
        self.split = invariant and self.in_features > BLOCK
        self.wt = weight.t()
        self.qweight = self.scales = self.levels = self.native = None
        if quant in BITS:
            if weight.dtype != torch.bfloat16:
                raise ValueError(f"{quant} weights run in bfloat16, not {weight.dtype}")
            native.library()  # builds the kernels now, or says why it cannot
            if packed is None:
                self.levels, self.scales = quantize_levels(weight, weight.dtype, BITS[quant])  # until `dequantized` ran
                packed = native.pack_levels(self.levels, self.scales, BITS[quant])
            self.qweight = packed
            self.native = native.linear_struct(self.qweight, bias, self.out_features, BITS[quant])
        elif quant != "none":
            raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")

    def dequantized(self) -> torch.Tensor:
        """The weight the quantized kernel multiplies by, in the model dtype (plain: the weight)."""
        if self.quant == "none":
            return self.weight
        levels = self.levels.float().reshape(self.out_features, -1, GROUP)
        sz = self.scales.float().transpose(0, 1)  # (N, K / GROUP, 2)
        mid = 2 ** (BITS[self.quant] - 1)
        return ((levels - mid) * sz[..., :1] + sz[..., 1:]).reshape(self.out_features, -1).to(self.weight.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        quant = self.quant
        if quant == "none" or x.numel() > SHORT_QUERY * self.in_features:
            if not self.split:
                return F.linear(x, self.weight, self.bias)
            out = split_k_matmul(x, self.wt)
            return out if self.bias is None else out + self.bias
        rows = x.reshape(-1, self.in_features)
        return bindings.linear(self.native, rows).view(*x.shape[:-1], self.out_features)  # + bias

    def weight_bytes(self) -> int:
        """Bytes read from memory by one product (weights, scales, bias)."""
        if self.quant == "none":
            n = self.weight.numel() * self.weight.element_size()
        else:  # the packed blocks, padded to whole blocks of output features as decode.c reads them
            n = self.qweight.numel()
        return n + (self.bias.numel() * self.bias.element_size() if self.bias is not None else 0)
