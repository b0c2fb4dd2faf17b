"""Attention for short queries in bfloat16 on the CPU.

PyTorch's CPU kernel of `scaled_dot_product_attention` is slow for a query of a few tokens in
bfloat16 (measured here: 500 us per layer for one query over 900 keys, against 100 us for two
plain matmuls and a float32 softmax), which made attention a quarter of SmolLM2's decode step.
Decode steps and verification passes (short queries) take the plain path; prompt passes keep
SDPA. The function is registered with transformers' attention interface, so `generate` on the
same model runs the same kernels as our decode loops (the identity tests rely on that).
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


def short_query_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """(batch, heads, q, d) inputs as transformers passes them; returns ((batch, q, heads, d), None)."""
    q_len = query.shape[2]
    if q_len > SHORT_QUERY or query.dtype == torch.float32 or kwargs.get("softcap") or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    # group the query heads that share a key/value head instead of repeating keys and values
    grouped = query.reshape(batch, kv_heads, (heads // kv_heads) * q_len, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale)
    scores = scores.view(batch, kv_heads, heads // kv_heads, q_len, -1)
    if attention_mask is not None:
        mask = attention_mask[:, :, -q_len:, : key.shape[2]].unsqueeze(2)  # (b, 1|kv, 1, q, k)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, kv_heads, (heads // kv_heads) * q_len, -1)
    out = split_k_matmul(probs, value).view(batch, heads, q_len, dim)  # batch-invariant past 1024 keys
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> None:
    """Make NAME known to transformers (once, when a model first needs it)."""
    AttentionInterface.register(NAME, short_query_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_short_query_attention(hf_model) -> bool:
    """Switch a CPU model in a low-precision dtype to the plain path; True if it was switched."""
    if hf_model.device.type != "cpu" or hf_model.dtype == torch.float32:
        return False
    if getattr(hf_model.config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    hf_model.set_attn_implementation(NAME)
    return True
