"""The short-query attention path computes what SDPA computes (GQA, masks, several queries)."""

import pytest
import torch
import torch.nn.functional as F

from dyncomplete.models.attention import NAME, short_query_attention


class _Module:
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("mask_kind", ["none", "additive", "bool"])
def test_matches_sdpa_in_bfloat16(q_len, mask_kind):
    g = torch.Generator().manual_seed(q_len)
    query = torch.randn(1, 9, q_len, 64, generator=g).bfloat16()
    key, value = (torch.randn(1, 3, 40, 64, generator=g).bfloat16() for _ in range(2))
    allowed = torch.ones(q_len, 40, dtype=torch.bool).tril(diagonal=40 - q_len)  # causal
    allowed[:, :7] = False  # and a window
    mask = {"none": None, "additive": torch.zeros(1, 1, q_len, 40).masked_fill(~allowed, float("-inf")).bfloat16(),
            "bool": allowed[None, None]}[mask_kind]
    out, _ = short_query_attention(_Module(), query, key, value, mask, scaling=0.1)
    ref = F.scaled_dot_product_attention(query.float(), key.float().repeat_interleave(3, 1),
                                         value.float().repeat_interleave(3, 1),
                                         attn_mask=None if mask is None else allowed[None, None], scale=0.1)
    assert out.shape == (1, q_len, 9, 64)
    torch.testing.assert_close(out.float(), ref.transpose(1, 2), atol=2e-2, rtol=2e-2)


@pytest.mark.model
def test_bfloat16_cpu_models_use_it_and_float32_ones_keep_sdpa(smollm, smollm_bf16):
    assert smollm_bf16.config._attn_implementation == NAME
    assert smollm.config._attn_implementation == "sdpa"
