"""LayeredModel reproduces each architecture's own logits, with and without a KV cache."""

import pytest
import torch
from helpers import TINY, tiny_model

from dyncomplete.models import LayeredModel


@pytest.mark.parametrize("kind", list(TINY))
def test_all_layers_by_hand_match_model_logits(kind):
    hf = tiny_model(kind)
    model = LayeredModel(hf)
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits.float()
    got = model.forward(ids, last_only=False)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", list(TINY))
def test_cached_decoding_matches_full_pass(kind):
    hf = tiny_model(kind)
    model = LayeredModel(hf)
    ids = torch.randint(3, 128, (1, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits.float()
    cache = model.new_cache()
    chunks = [ids[:, :5], ids[:, 5:6], ids[:, 6:10], ids[:, 10:11], ids[:, 11:14]]
    got = torch.cat([model.forward(chunk, cache, last_only=False) for chunk in chunks], dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert cache.lengths == [14] * model.num_layers


def test_crop_rolls_back_cache():
    model = LayeredModel(tiny_model("llama"))
    ids = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache()
    model.forward(ids[:, :6], cache)
    model.forward(torch.tensor([[7, 8, 9]]), cache)  # a rejected draft
    cache.crop(6)
    got = model.forward(ids[:, 6:], cache, last_only=False)
    torch.testing.assert_close(got, model.forward(ids, last_only=False)[:, 6:], rtol=1e-4, atol=1e-4)
