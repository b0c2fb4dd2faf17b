"""LITE: the loss weights follow GREEN-CODE's recipe, a short LoRA run lowers the loss, and the
saved adapter loads as `ALIAS-lite`, merged into the base weights."""

import json

import pytest
import torch

from dyncomplete.models import ModelError, load
from dyncomplete.models import tuned
from dyncomplete.training.collect import code_chunks
from dyncomplete.training.lite import lite_weights, train_lite


def test_weights_follow_the_recipe():
    w = lite_weights([4, 8, 12, 16, 20, 24, 28], 30)
    assert sum(w.values()) == pytest.approx(1.0)
    assert sum(w[e] for e in (4, 8, 12)) == pytest.approx(0.7) and w[30] == pytest.approx(0.1)
    assert w[8] / w[4] == pytest.approx(0.9) and w[20] / w[16] == pytest.approx(0.9)


def test_only_a_registered_base_makes_a_tuned_name():
    assert tuned.tuned_base("smollm2-135m-lite") == "smollm2-135m"
    assert tuned.tuned_base("smollm2-135m") is None and tuned.tuned_base("nope-lite") is None


@pytest.mark.model
def test_short_lora_run_lowers_the_loss_and_loads_merged_as_the_lite_model(tmp_path, monkeypatch):
    model = load("smollm2-135m", dtype="float32", progress=lambda m: None)  # own copy: LoRA edits it
    torch.manual_seed(0)
    chunks = code_chunks(model.tokenizer, "train", 10, chunk=32)[:1]
    peft_model, losses = train_lite(model, [26], chunks, steps=4, lr=3e-3, progress=False)
    assert losses[-1] < losses[0]
    assert any("lora" in n for n, p in peft_model.named_parameters() if p.requires_grad)

    monkeypatch.setattr(tuned, "ASSETS", tmp_path)
    tuned.save_adapter(peft_model, tuned.adapter_dir("smollm2-135m-lite"), {"base_sha256": model.source_sha256})
    ids = torch.tensor([chunks[0]])
    with torch.no_grad():
        want = peft_model(ids).logits  # the adapter applied beside the base weights
        lite = load("smollm2-135m-lite", dtype="float32", progress=lambda m: None)
        got = lite.hf(ids).logits
    assert lite.name == "smollm2-135m-lite" and lite.source_sha256 != model.source_sha256
    # merged weights with the adapter rounded to bfloat16 for shipping: the same predictions
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95
    assert torch.allclose(got, want, atol=0.5)

    record = tuned.adapter_dir("smollm2-135m-lite") / tuned.RECORD
    record.write_text(json.dumps({"base_sha256": "0" * 64}))
    with pytest.raises(ModelError, match="trained on other weights"):
        load("smollm2-135m-lite", dtype="float32", progress=lambda m: None)


@pytest.mark.model
def test_the_shipped_lite_model_loads_with_its_own_exit_heads_and_refuses_the_bases(smollm):
    from dyncomplete.exits.heads import default_path, load_heads

    lite = load("smollm2-135m-lite", quant="int4", progress=lambda m: None)
    heads = load_heads(lite)
    assert heads.kind == "translator" and heads.metadata["calib_agreement"]["translator"]["20"] > 0.6
    with pytest.raises(ValueError, match="other weights"):
        load_heads(lite, default_path(smollm))  # the base model's heads
