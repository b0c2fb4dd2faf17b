"""Snapshots of the int4 engine's weights (`models/packed.py`, issue 31 item 3): made once, then
loaded as the same model bit for bit, checked against their digest, made again when what they
were made from changes; the model built in the run that makes one runs every prompt path."""

import re

import pytest
import torch

from dyncomplete.engine import GenerationParams
from dyncomplete.methods import make_method
from dyncomplete.models import ModelError, load, packed
from dyncomplete.models.attention import SHORT_QUERY
from test_models import copy_of_smollm, with_spec

pytestmark = pytest.mark.model


@pytest.fixture
def test_smollm(tmp_path, monkeypatch):
    """`test-smollm`: the cached SmolLM2 copy under a cache of its own, with no snapshot yet."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("DYNCOMPLETE_CACHE", str(cache))
    with_spec(monkeypatch)
    copy_of_smollm(cache / "models" / "test-smollm", digest=True)
    return cache / "packed" / "test-smollm-bfloat16-int4"


def int4(said=None):
    return load("test-smollm", dtype="bfloat16", quant="int4", progress=(said.append if said is not None else print))


def greedy_logits(model, steps=8):
    ids = torch.tensor(model.tokenizer("def fib(n):\n    if n < 2:\n        return n\n" * 3)["input_ids"])
    cache = model.new_cache()
    logits = [model.forward(ids, cache)]
    for _ in range(steps):
        logits.append(model.forward(logits[-1][0, -1].argmax().view(1), cache))
    return torch.cat(logits, dim=1)


def test_a_snapshot_loads_the_same_model_bit_for_bit(test_smollm):
    said = []
    built = int4(said)
    assert any("saving test-smollm" in line for line in said) and (test_smollm / "snapshot.json").is_file()
    said.clear()
    mapped = int4(said)
    assert not said  # nothing converted, quantized or saved again
    assert (mapped.engine, mapped.quant, mapped.source_sha256) == (built.engine, built.quant, built.source_sha256)
    for a, b in [(built.hf.named_parameters(remove_duplicate=False), mapped.hf.named_parameters(remove_duplicate=False)),
                 (built.hf.named_buffers(), mapped.hf.named_buffers())]:
        a, b = dict(a), dict(b)
        assert a.keys() == b.keys()
        assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert mapped.hf.lm_head.weight is mapped.hf.model.embed_tokens.weight  # still tied
    blocks = built.engines["fast"].linears(), mapped.engines["fast"].linears()
    assert blocks[0].keys() == blocks[1].keys()
    assert all(torch.equal(blocks[0][k].qweight, blocks[1][k].qweight) for k in blocks[0])
    assert mapped.weight_bytes_per_token() == built.weight_bytes_per_token()
    assert torch.equal(greedy_logits(built), greedy_logits(mapped))


def test_a_model_built_this_run_runs_a_shallow_prompt_through_pytorch(test_smollm, monkeypatch):
    """The first load builds the engine from trainable modules; a `prompt=L` pass over a prompt
    longer than SHORT_QUERY on PyTorch's path (long prompts' path on CPUs with AMX) ran its layers
    with autograd on and failed on the weights' views (the README's first command on a Xeon)."""
    built = int4([])
    monkeypatch.setattr(built.engines["fast"], "native_prompt_max", SHORT_QUERY)
    ids = built.tokenizer("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n")["input_ids"]
    assert len(ids) > SHORT_QUERY
    out = make_method("early-exit:static@18/kv=propagate/prompt=18", built).generate(
        built, ids, GenerationParams(max_new_tokens=4))
    assert len(out.token_ids) == 4


def test_a_damaged_snapshot_is_refused_with_what_to_delete(test_smollm):
    int4()
    shard = test_smollm / "shard-1.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    with pytest.raises(ModelError, match=f"differ from the digest .*shard-1.pt.*delete {re.escape(str(test_smollm))}"):
        int4()


def test_a_snapshot_is_made_again_when_what_it_was_made_from_changes(test_smollm, monkeypatch):
    int4()
    monkeypatch.setattr(packed, "FORMAT", packed.FORMAT + 1)
    said = []
    int4(said)
    assert any("saving test-smollm" in line for line in said)
    assert packed.Snapshot.for_load("test-smollm", torch.bfloat16, "int4", "auto", "cpu").current()


def test_only_the_int4_engine_gets_snapshots(test_smollm):
    load("test-smollm", dtype="bfloat16", quant="none", progress=lambda m: None)
    load("test-smollm", dtype="float32", quant="auto", progress=lambda m: None)
    assert not test_smollm.exists()
