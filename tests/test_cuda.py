"""The PyTorch path on a GPU (run by `.ci/gpu-check` where a GPU is lent; skipped elsewhere): a
position's logits in a verification pass are the bits of its one-token step, and the lossless
methods give baseline's tokens. A random-weight llama of Qwen2.5-Coder-0.5B's widths, built there,
since no weights travel to a lent GPU."""

import pytest
import torch
from helpers import byte_tokenizer, same_bits_alone_and_in_a_pass
from transformers import AutoModelForCausalLM, LlamaConfig

from dyncomplete.engine import GenerationParams
from dyncomplete.methods import make_method
from dyncomplete.models import LayeredModel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# Seen on an H200 (docs/results.md, "On a GPU"): float32 products on CUDA give a row other bits by row
# count, and so do the Hugging Face engine's separate, narrow key and value products in bfloat16
# (the fast engine fuses them). Expected failures there, still run and reported.
ROW_DEPENDENT = pytest.mark.xfail(strict=False, reason="these CUDA products depend on the row count")


@pytest.fixture(scope="module", params=[
    pytest.param((e, d), id=f"{e}-{d}", marks=() if (e, d) == ("fast", "bfloat16") else ROW_DEPENDENT)
    for e in ("fast", "hf") for d in ("bfloat16", "float32")])
def model(request):
    engine, dtype = request.param
    tokenizer = byte_tokenizer(fim=False)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).to("cuda", getattr(torch, dtype))
    return LayeredModel(hf, tokenizer, name="gpu-check", engine=engine)


def test_a_position_gets_the_same_logits_alone_or_in_a_verification_pass(model):
    ids = model.tokenizer("def area(r):\n    return 3.14159 * r * r\n" * 8).input_ids
    assert same_bits_alone_and_in_a_pass(model, ids) == [True] * 8
    assert same_bits_alone_and_in_a_pass(model, ids, 3) == [True] * 3  # another row count


def test_lookup_gives_baselines_tokens(model):
    ids = model.tokenizer("for i in range(10):\n    print(i)\n" * 6).input_ids
    params = GenerationParams(max_new_tokens=48)
    base = make_method("baseline", model).generate(model, ids, params)
    lookup = make_method("lookup", model).generate(model, ids, params)
    assert lookup.token_ids == base.token_ids
    assert lookup.stats.drafted > 0  # drafts were verified, not only plain steps
