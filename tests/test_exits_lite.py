"""LITE: the loss weights follow GREEN-CODE's recipe and a short LoRA run lowers the loss."""

import pytest
import torch

from dyncomplete.training.collect import code_chunks
from dyncomplete.training.lite import lite_weights, train_lite
from dyncomplete.models import load


def test_weights_follow_the_recipe():
    w = lite_weights([4, 8, 12, 16, 20, 24, 28], 30)
    assert sum(w.values()) == pytest.approx(1.0)
    assert sum(w[e] for e in (4, 8, 12)) == pytest.approx(0.7) and w[30] == pytest.approx(0.1)
    assert w[8] / w[4] == pytest.approx(0.9) and w[20] / w[16] == pytest.approx(0.9)


@pytest.mark.model
def test_short_lora_run_lowers_the_loss():
    model = load("smollm2-135m", dtype="float32", progress=lambda m: None)  # own copy: LoRA edits it
    torch.manual_seed(0)
    chunks = code_chunks(model.tokenizer, "train", 10, chunk=32)[:1]
    peft_model, losses = train_lite(model, [26], chunks, steps=4, lr=3e-3, progress=False)
    assert losses[-1] < losses[0]
    assert any("lora" in n for n, p in peft_model.named_parameters() if p.requires_grad)
