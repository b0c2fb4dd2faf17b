"""The wrong-token stop rule: labels from real code, and the `+stop:T` wrapper around a method."""

import pytest

from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline
from dyncomplete.methods import make_method
from dyncomplete.methods.stop_rule import StopRule
from dyncomplete.training.collect import SKIP, code_chunks, collect
from dyncomplete.training.stop_rule import train_stop_rule, wrong_labels

pytestmark = pytest.mark.model


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
    assert smollm.head_tap is None  # the tap is gone after generation


def test_unknown_wrapper_is_refused(smollm):
    with pytest.raises(ValueError, match="unknown method"):
        make_method("baseline+nonsense:1", smollm)
    with pytest.raises(ValueError, match="threshold"):
        make_method("baseline+stop:x", smollm)


def test_shipped_stop_rule_and_classifier_build(smollm):
    method = make_method("early-exit:classifier@0.99+stop:0.9", smollm)
    assert isinstance(method, StopRule) and method.inner.policy.mlps.keys() == set(method.inner.heads.layers)


@pytest.mark.parametrize("inner", ["lookup", "self-spec", "lookup+self", "early-exit:rl@0.99"])
def test_wrapper_runs_the_inner_methods_prompt_work(smollm, inner):
    """`+stop` over a method with prompt work (`prepare`: lookup's index, a proposer's statistics)
    decodes like the method alone when the rule never fires."""
    ids = smollm.tokenizer("def area(r):\n    return 3.14 *", add_special_tokens=False).input_ids
    params = GenerationParams(max_new_tokens=8)
    wrapped = make_method(f"{inner}+stop:1.0", smollm).generate(smollm, ids, params)
    assert wrapped.token_ids == make_method(inner, smollm).generate(smollm, ids, params).token_ids


def test_wrapper_refuses_a_method_that_does_not_use_our_loop(smollm):
    with pytest.raises(ValueError, match="cannot wrap"):
        make_method("hf-generate+stop:0.5", smollm)


def test_the_default_models_shipped_stop_rule_gives_baselines_tokens_at_its_strictest(qwen05):
    ids = qwen05.tokenizer("def area(r):\n    return 3.14 *", add_special_tokens=False).input_ids
    params = GenerationParams(max_new_tokens=8)
    never = make_method("baseline+stop:1.0", qwen05).generate(qwen05, ids, params)
    assert never.token_ids == Baseline().generate(qwen05, ids, params).token_ids and never.stats.extra_macs > 0
    always = make_method("baseline+stop:-1", qwen05).generate(qwen05, ids, params)
    assert always.token_ids == [] and always.stats.stopped_by == "stop_rule"
