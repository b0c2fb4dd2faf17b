"""Batch-invariant products for low-precision CPU models: a row's result must not depend on how
many rows are computed with it.

Speculative verification runs k positions in one pass, plain decoding one; the greedy output is
only identical if each position's logits are bit for bit the same either way. oneDNN's bfloat16
GEMM on this CPU keeps that for reductions of up to 1024 products, but over longer ones (SmolLM2's
MLP down projection, K = 1536; attention over more than 1024 keys) it sums in an order that
depends on the number of rows, and the rounding to bfloat16 then flips near-tied tokens: 25% of
`lookup`'s HumanEval completions differed from `baseline` in bfloat16, none in float32.
Splitting every such reduction into blocks of at most 1024 and adding the blocks' results makes
each row's result independent of the others, for about 1.5 ms per SmolLM2 token.

That holds only where the CPU has bfloat16 instructions (AVX512-BF16, AMX). On an Ice Lake Xeon
without them the GEMM's rows depend on the row count at K = 576 too (and attention's over 512
keys), so a bfloat16 model on PyTorch's products is not lossless there; `load` says so. There
`--dtype auto` runs the int4 kernels of `native/`, row-invariant by construction.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 1024  # longest reduction the bfloat16 GEMM computes row-invariantly here


def split_k_matmul(a: torch.Tensor, b: torch.Tensor, product=torch.matmul) -> torch.Tensor:
    """a @ b with the reduction (a's last, b's second-to-last dimension) cut into BLOCK pieces.
    `product` may be `torch.bmm` for 3-D operands: it reads strided slices without copying them."""
    k = a.shape[-1]
    if k <= BLOCK:
        return product(a, b)
    out = product(a[..., :BLOCK], b[..., :BLOCK, :])
    for start in range(BLOCK, k, BLOCK):
        out = out + product(a[..., start : start + BLOCK], b[..., start : start + BLOCK, :])
    return out


def split_k_linear(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`linear(x)` with the reduction over input features cut into BLOCK pieces (the weight is
    sliced in place, so no copy of it is kept)."""
    out = split_k_matmul(x, linear.weight.t())
    return out if linear.bias is None else out + linear.bias


def make_batch_invariant(layers) -> None:
    """Give the wide linear layers inside `layers` (decoder layers of a low-precision CPU model)
    the split reduction; they stay `torch.nn.Linear`, so peft's LoRA still finds them."""
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear) and module.in_features > BLOCK:
                module.forward = functools.partial(split_k_linear, module)
