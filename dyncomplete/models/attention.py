"""Attention for short queries in bfloat16, on the CPU and on a GPU.

PyTorch's CPU kernel of `scaled_dot_product_attention` is slow for a query of a few tokens in
bfloat16 (measured here: 500 us per layer for one query over 900 keys, against 100 us for two
plain matmuls and a float32 softmax), which made attention a quarter of SmolLM2's decode step.
Decode steps and verification passes (short queries) take the plain path; prompt passes keep
SDPA. The function is registered with transformers' attention interface, so `generate` on the
same model runs the same kernels as our decode loops (the identity tests rely on that). On a GPU
the same path, with short queries padded to one row count, keeps a position's bits the same alone
and in a verification pass, which SDPA's kernels did not (`gpu_padding`).
"""

from __future__ import annotations

import functools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .invariant import split_k_matmul

NAME = "dyncomplete_cpu"
SHORT_QUERY = 16  # query lengths up to this take the plain path


def gpu_padding(q_len: int, device: torch.device) -> int:
    """Zero query rows a short query gets on a GPU, up to SHORT_QUERY. There the attention
    products' kernels, and so the order of a row's sums, depend on the row count (docs/results.md,
    "On a GPU"): with one count, a position gets the same bits alone and in a verification pass."""
    return SHORT_QUERY - q_len if device.type == "cuda" else 0


def with_rows_repeated(mask: torch.Tensor, pad: int) -> torch.Tensor:
    """`mask` (..., q, k) with its last row repeated `pad` times: padded rows attend like a real one."""
    return torch.cat([mask, mask[..., -1:, :].expand(*mask.shape[:-2], pad, mask.shape[-1])], dim=-2)


def short_query_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """(batch, heads, q, d) inputs as transformers passes them; returns ((batch, q, heads, d), None)."""
    q_len = query.shape[2]
    if q_len > SHORT_QUERY or query.dtype == torch.float32 or kwargs.get("softcap") or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    pad = gpu_padding(q_len, query.device)
    rows = q_len + pad
    if pad:
        query = torch.nn.functional.pad(query, (0, 0, 0, pad))
    # group the query heads that share a key/value head instead of repeating keys and values
    grouped = query.reshape(batch, kv_heads, (heads // kv_heads) * rows, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale)
    scores = scores.view(batch, kv_heads, heads // kv_heads, rows, -1)
    if attention_mask is not None:
        mask = attention_mask[:, :, -q_len:, : key.shape[2]]
        mask = (with_rows_repeated(mask, pad) if pad else mask).unsqueeze(2)  # (b, 1|kv, 1, q, k)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, kv_heads, (heads // kv_heads) * rows, -1)
    out = split_k_matmul(probs, value).view(batch, heads, rows, dim)  # batch-invariant past 1024 keys
    return out[:, :, :q_len].transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> None:
    """Make NAME known to transformers (once, when a model first needs it)."""
    AttentionInterface.register(NAME, short_query_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_short_query_attention(hf_model) -> bool:
    """Switch a CPU or CUDA model in a low-precision dtype to the plain path; True if it was switched."""
    if hf_model.device.type not in ("cpu", "cuda") or hf_model.dtype == torch.float32:
        return False
    if getattr(hf_model.config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    hf_model.set_attn_implementation(NAME)
    return True
