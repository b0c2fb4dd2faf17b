"""The wrong-token stop rule: labels from real code, and the `+stop:T` wrapper around a method."""

import pytest
import torch

from dyncomplete.decoding import Baseline, GenerationParams
from dyncomplete.exits.collect import SKIP, code_chunks, collect
from dyncomplete.exits.stop_rule import StopRule, train_stop_rule, wrong_labels
from dyncomplete.methods import make_method


@pytest.fixture(scope="module")
def chunk_data(smollm):
    chunks = code_chunks(smollm.tokenizer, "train", 150, chunk=96)
    return chunks, collect(smollm, [20], chunks, progress=False)


def test_labels_compare_the_prediction_with_the_real_next_token(chunk_data):
    chunks, data = chunk_data
    idx, wrong = wrong_labels(data, chunk=96)
    assert len(idx) == len(data) - len(chunks)  # the last position of a chunk has no next token
    first = chunks[0]
    assert bool(wrong[0]) == (int(data.top_ids[0, 0]) != first[SKIP + 1])
    assert 0.1 < wrong.float().mean() < 0.9


def test_wrapper_stops_before_the_token_and_restores_the_head(smollm, chunk_data):
    mlp = train_stop_rule(chunk_data[1], steps=20, batch=64, chunk=96)
    ids = smollm.tokenizer("def area(r):\n    return 3.14 *", add_special_tokens=False).input_ids
    params = GenerationParams(max_new_tokens=8)
    base = Baseline().generate(smollm, ids, params)
    never = StopRule(Baseline(), 1.0, mlp).generate(smollm, ids, params)
    assert never.token_ids == base.token_ids and never.stats.extra_macs > 0
    always = StopRule(Baseline(), -1.0, mlp).generate(smollm, ids, params)
    assert always.token_ids == [] and always.stats.stopped_by == "stop_rule"
    assert "head" not in vars(smollm)  # the tap is gone after generation


def test_unknown_wrapper_is_refused(smollm):
    with pytest.raises(ValueError, match="unknown wrapper"):
        make_method("baseline+nonsense:1", smollm)
    with pytest.raises(ValueError, match="threshold"):
        make_method("baseline+stop:x", smollm)


def test_shipped_stop_rule_and_classifier_build(smollm):
    method = make_method("early-exit:classifier@0.99+stop:0.9", smollm)
    assert isinstance(method, StopRule) and method.inner.policy.mlps.keys() == set(method.inner.heads.layers)
