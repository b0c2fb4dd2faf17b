"""LITE: the loss weights follow GREEN-CODE's recipe, a short LoRA run lowers the loss, the
saved adapter loads as `ALIAS-lite`, merged into the base weights; FIM examples are the engine's
own prompts with the middle and its end after them."""

import json

import pytest
import torch

from dyncomplete.models import ModelError, load
from dyncomplete.models import tuned
from dyncomplete.training.collect import code_chunks
from dyncomplete.engine.prompts import fim_tokens
from dyncomplete.training.fim import END_OF_MIDDLE, KINDS, fim_examples
from dyncomplete.training.lite import lite_loss, lite_weights, train_lite


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
    chunks = [(ids, 1) for ids in code_chunks(model.tokenizer, "train", 10, chunk=32)[:1]]
    peft_model, losses = train_lite(model, [26], chunks, steps=4, lr=3e-3, progress=False)
    assert losses[-1] < losses[0]
    assert any("lora" in n for n, p in peft_model.named_parameters() if p.requires_grad)

    monkeypatch.setattr(tuned, "ASSETS", tmp_path)
    tuned.save_adapter(peft_model, tuned.adapter_dir("smollm2-135m-lite"), {"base_sha256": model.source_sha256})
    ids = torch.tensor([chunks[0][0]])
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
def test_training_goes_on_from_a_saved_adapter(tmp_path):
    model = load("smollm2-135m", dtype="float32", progress=lambda m: None)  # own copy: LoRA edits it
    torch.manual_seed(0)
    chunks = [(ids, 1) for ids in code_chunks(model.tokenizer, "train", 10, chunk=32)[:1]]
    peft_model, losses = train_lite(model, [26], chunks, steps=4, lr=3e-3, progress=False)
    tuned.save_adapter(peft_model, tmp_path, {"rank": 16})
    again = load("smollm2-135m", dtype="float32", progress=lambda m: None)
    _, fresh = train_lite(again, [26], chunks, steps=1, lr=0.0, progress=False)
    again = load("smollm2-135m", dtype="float32", progress=lambda m: None)
    _, going_on = train_lite(again, [26], chunks, steps=1, lr=0.0, progress=False, init=tmp_path)
    assert fresh[0] == pytest.approx(losses[0], rel=1e-5)  # a new adapter starts as the base model
    assert going_on[0] < losses[-1] < fresh[0]  # from where the saved one ended (one more step taken)


@pytest.mark.model
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_adapter_merges_to_peft_s_own_bits_without_peft(dtype, monkeypatch):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from dyncomplete.models.loading import cached_dir

    folder = tuned.adapter_dir("smollm2-135m-lite")
    base = lambda: AutoModelForCausalLM.from_pretrained(cached_dir("smollm2-135m"), dtype=dtype)
    want = PeftModel.from_pretrained(base(), str(folder)).merge_and_unload().state_dict()
    monkeypatch.setitem(__import__("sys").modules, "peft", None)  # any import of peft fails from here
    got = base()
    before = {name: weight.clone() for name, weight in got.state_dict().items()}
    tuned.merge_lora(got, load_file(str(folder / "adapter_model.safetensors")),
                     json.loads((folder / "adapter_config.json").read_text()))
    assert want.keys() == got.state_dict().keys()
    for name, weight in got.state_dict().items():
        assert torch.equal(weight, want[name]), name
    changed = [name for name, weight in got.state_dict().items() if not torch.equal(weight, before[name])]
    assert len(changed) == 7 * 30  # every targeted linear layer of every block


def test_an_adapter_other_than_plain_lora_is_refused():
    config = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "use_dora": True}
    with pytest.raises(ModelError, match="not a plain LoRA adapter \\(use_dora\\)"):
        tuned.merge_lora(torch.nn.Linear(2, 2), {}, config)
    plain = {"peft_type": "LORA", "r": 16, "lora_alpha": 32}
    with pytest.raises(ModelError, match="no lora_B for model.layers.0.mlp.up_proj"):
        tuned.merge_lora(torch.nn.Module(), {"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(1)},
                         plain)


@pytest.mark.model
def test_the_shipped_lite_model_loads_with_its_own_exit_heads_and_refuses_the_bases(smollm):
    from dyncomplete.exits.heads import default_path, load_heads

    lite = load("smollm2-135m-lite", quant="int4", progress=lambda m: None)
    heads = load_heads(lite)
    assert heads.kind == "translator" and heads.metadata["calib_agreement"]["translator"]["20"] > 0.6
    with pytest.raises(ValueError, match="other weights"):
        load_heads(lite, default_path(smollm))  # the base model's heads


@pytest.mark.model
def test_the_loss_is_taken_from_the_first_target_on(smollm):
    ids = torch.tensor([code_chunks(smollm.tokenizer, "train", 1, chunk=24)[0]])
    with torch.no_grad():
        logits = smollm.hf(ids).logits[0].float()
        got = lite_loss(smollm, ids, {smollm.num_layers: 1.0}, start=17)
    want = torch.nn.functional.cross_entropy(logits[16:-1], ids[0, 17:])
    assert got == pytest.approx(want.item(), rel=1e-4)
    assert got != pytest.approx(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:]).item(), rel=1e-3)


@pytest.mark.model
def test_fim_examples_are_the_engines_prompts_then_the_middle_and_its_end(qwen05):
    tok = qwen05.tokenizer
    examples = fim_examples(tok, "train", 3 * len(KINDS), budget=256)
    end = tok.convert_tokens_to_ids(END_OF_MIDDLE)
    prefix_token, suffix_token, middle_token = fim_tokens(tok)
    for i, (ids, first) in enumerate(examples):
        kind = KINDS[i % len(KINDS)]
        prompt, target = ids[:first], ids[first:]
        assert len(prompt) <= 256 and 0 < len(target)
        if kind == "prefix-only":  # a line completion: no FIM tokens, no end, one line
            assert prefix_token not in prompt and end not in target
            assert "\n" not in tok.decode(target).removesuffix("\n")  # a file's last line may have no newline
        else:
            assert prompt[0] == prefix_token and suffix_token in prompt and middle_token in prompt
            assert target[-1] == end and end not in target[:-1]
    lines = [tok.decode(ids[first:-1]) for ids, first in examples[KINDS.index("lines") :: len(KINDS)]]
    assert all(text.endswith("\n") for text in lines)  # whole lines


@pytest.mark.model
def test_fim_examples_need_fim_tokens(smollm):
    with pytest.raises(ValueError, match="fill-in-the-middle tokens"):
        fim_examples(smollm.tokenizer, "train", 3)


@pytest.mark.model
def test_the_shipped_qwen_lite_fills_the_middle_and_stops_there(qwen05):
    """The issue's own case: the instruct build writes `return 2 * math.pi * r` and a new function;
    the FIM-tuned build writes the missing assignment and ends."""
    from dyncomplete.engine import GenerationParams, build_prompt
    from dyncomplete.methods.baseline import Baseline

    lite = load("qwen2.5-coder-0.5b-lite", quant="int4", progress=lambda m: None)
    assert json.loads((tuned.adapter_dir(lite.name) / tuned.RECORD).read_text())["fim"] is True
    prompt = build_prompt(lite.tokenizer, "import math\n\ndef circle(r):\n", "    return circumference\n")
    out = Baseline().generate(lite, prompt.ids, GenerationParams(max_new_tokens=48))
    assert out.stats.stopped_by == "eos"
    assert out.text.strip().startswith("circumference =") and "return" not in out.text
