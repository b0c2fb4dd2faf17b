"""The shipped exit agent as policy `rl@T` inside early-exit decoding, on the real model."""

import pytest
import torch

from dyncomplete.engine import GenerationParams
from dyncomplete.training.collect import SKIP, code_chunks, collect
from dyncomplete.exits.heads import lens_heads
from dyncomplete.training.rl.data import precompute
from dyncomplete.methods import make_method

pytestmark = pytest.mark.model

PROMPT = "import os\n\n\ndef list_python_files(root):\n    result = []\n    for name in sorted(os.listdir(root)):\n"


def generate(model, method: str):
    ids = model.tokenizer(PROMPT)["input_ids"]
    return make_method(method, model).generate(model, ids, GenerationParams(max_new_tokens=12))


def test_threshold_one_never_exits_and_zero_always_does(smollm):
    base = generate(smollm, "baseline")
    strict = generate(smollm, "early-exit:rl@1.0")
    assert strict.text == base.text
    assert set(strict.stats.token_layers) == {smollm.num_layers}
    assert strict.stats.extra_macs > 0  # the agent's own checks are counted
    eager = generate(smollm, "early-exit:rl@0.0")  # P(exit) > 0 at the first exit layer
    assert max(eager.stats.token_layers[1:]) < smollm.num_layers


def test_precompute_aligns_predictions_and_next_tokens(smollm):
    heads = lens_heads(smollm, [10, 20])
    ids = code_chunks(smollm.tokenizer, "train", 1, 64, seed=1)[0]  # twice: a chunk boundary inside
    data = precompute(smollm, heads, collect(smollm, heads.layers, [ids, ids]), chunk=64)
    logits = smollm.forward(torch.tensor(ids), last_only=False)[0, SKIP:]
    n = len(ids) - SKIP
    assert data.hidden.shape == (2 * n, 2, smollm.hidden_size)
    assert data.final_preds.tolist() == 2 * logits.argmax(-1).tolist()
    assert data.truth.tolist() == 2 * (ids[SKIP + 1:] + [-1])  # no next token at a chunk's end
    rms = torch.from_numpy(data.hidden).float().pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-2, rtol=0)
