"""Low-precision CPU models compute each position the same whether it runs alone or with others,
which is what lets bfloat16 speculative decoding reproduce plain decoding bit for bit."""

import glob

import pytest
import torch
from helpers import rows_may_depend_on_count, same_bits_alone_and_in_a_pass

from dyncomplete.models.invariant import BLOCK, split_k_linear, split_k_matmul
from dyncomplete.paths import cpu_has_bf16


@pytest.mark.parametrize("width", [1536, 4864])
@pytest.mark.xfail(not cpu_has_bf16(), strict=False,
                   reason="no bfloat16 instructions on this CPU: PyTorch's bfloat16 products depend on the row count")
def test_wide_bfloat16_linear_gives_each_row_the_same_result_at_any_batch_size(width):
    g = torch.Generator().manual_seed(width)
    linear = torch.nn.Linear(width, 576).bfloat16()
    x = torch.randn(12, width, generator=g).bfloat16()
    alone = [split_k_linear(linear, x[r : r + 1])[0] for r in range(12)]
    for m in range(2, 13):
        together = split_k_linear(linear, x[:m])
        assert all(torch.equal(together[r], alone[r]) for r in range(m)), m
    torch.testing.assert_close(split_k_linear(linear, x).float(), linear.float()(x.float()), atol=0.1, rtol=0.05)


def test_split_matmul_computes_the_product():
    a, b = torch.randn(2, 3, 2 * BLOCK + 5), torch.randn(2, 2 * BLOCK + 5, 4)
    torch.testing.assert_close(split_k_matmul(a, b), a @ b, atol=1e-3, rtol=1e-4)


@pytest.mark.model
def test_bfloat16_model_gives_a_position_the_same_logits_alone_or_in_a_verification_pass(smollm_bf16, request):
    """Over more than BLOCK cached keys, so both the MLP and the attention reductions are split."""
    rows_may_depend_on_count(request, smollm_bf16)
    model = smollm_bf16
    source = max(glob.glob(torch.__file__.rsplit("/", 1)[0] + "/nn/modules/*.py"), key=lambda p: len(open(p).read()))
    ids = model.tokenizer(open(source).read()).input_ids[:1200]
    assert same_bits_alone_and_in_a_pass(model, ids) == [True] * 8
