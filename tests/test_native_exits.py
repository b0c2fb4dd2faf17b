"""Early exit with its decisions inside decode.c's layer loop (int4): the same layers, logits and
caches as the Python loop between native segments, the checks' probabilities those of the
policies, one native call a token, and baseline's tokens at the strictest thresholds."""

import pytest
import torch
from helpers import ids_of, stdlib_prompts

from dyncomplete.engine import GenerationParams, Stats, eos_ids_of
from dyncomplete.exits.heads import lens_heads, load_heads
from dyncomplete.exits.policies import make_policy
from dyncomplete.methods import make_method
from dyncomplete.methods.baseline import Baseline
from dyncomplete.methods.early_exit import EarlyExit

pytestmark = pytest.mark.model


def static(model, layer, heads, kv="catchup", native=True):
    method = EarlyExit(heads, make_policy("static", layer, model, heads), kv=kv)
    if not native:
        method.native = None  # the Python loop between native segments
    return method


def run_steps(model, ids, tokens, methods):
    """Prefill `ids`, then step `tokens[k]` with `methods[k]`: (logits, depths, pending, cache, stats)."""
    cache, stats = model.new_cache(), Stats()
    model.forward(torch.tensor(ids), cache)
    pending, depths, logits = [], [], None
    with torch.inference_mode():
        for k, (token, method) in enumerate(zip(tokens, methods)):
            logits, depth, pending = method.step(model, token, len(ids) + k, cache, pending, stats)
            depths.append(depth)
    return logits, depths, pending, cache, stats


def assert_same_cache(a, b):
    assert a.lengths == b.lengths
    for i, n in enumerate(a.lengths):
        assert torch.equal(a.keys_by_feature(i, 0, n), b.keys_by_feature(i, 0, n)), i
        assert torch.equal(a.values[i][:, :, :n], b.values[i][:, :, :n]), i


@pytest.mark.parametrize("kv", ["catchup", "propagate"])
def test_the_native_step_runs_what_the_python_loop_runs(smollm_int4, kv):
    """Exits at 20, 20, 10, then a token through every layer, which catches the exited positions
    up (kv=catchup: they join at layers 20, 20 and 10 inside the one call)."""
    ids = ids_of(smollm_int4, "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n")
    tokens = ids_of(smollm_int4, "    return a * b\n")[:4]
    heads = lens_heads(smollm_int4, [10, 20])
    results = []
    for native in (True, False):
        plan = [static(smollm_int4, layer, heads, kv, native) for layer in (20, 20, 10, 30)]
        results.append(run_steps(smollm_int4, ids, tokens, plan))
    (logits, depths, pending, cache, stats), (ref_logits, ref_depths, _, ref_cache, ref_stats) = results
    assert depths == ref_depths == [20, 20, 10, 30] and pending == []
    assert torch.equal(logits, ref_logits)
    assert_same_cache(cache, ref_cache)
    assert stats.layer_evals == ref_stats.layer_evals
    if kv == "catchup":  # every skipped layer ran once, later
        assert stats.layer_evals == 20 + 20 + 10 + 30 + (10 + 10 + 20)


def test_pending_positions_left_after_an_exit_are_the_python_loops(smollm_int4):
    ids = ids_of(smollm_int4, "import os\n\nfor name in os.listdir(")
    tokens = ids_of(smollm_int4, "path):\n    print(name)")[:3]
    heads = lens_heads(smollm_int4, [10, 20])
    native = run_steps(smollm_int4, ids, tokens, [static(smollm_int4, layer, heads) for layer in (20, 10, 10)])
    python = run_steps(smollm_int4, ids, tokens, [static(smollm_int4, layer, heads, native=False) for layer in (20, 10, 10)])
    assert [r for r, _ in native[2]] == [r for r, _ in python[2]] == [20, 10, 10]
    for (_, a), (_, b) in zip(native[2], python[2]):
        assert torch.equal(a, b)
    assert torch.equal(native[0], python[0])
    assert_same_cache(native[3], python[3])


@pytest.mark.parametrize("policy", ["classifier", "rl"])
def test_a_native_check_gives_the_policys_probability(smollm_int4, policy):
    heads = load_heads(smollm_int4)
    method = make_method(f"early-exit:{policy}@0.5", smollm_int4)
    engine = smollm_int4.engines["fast"]
    ids = torch.tensor(ids_of(smollm_int4, stdlib_prompts(2)[1]))
    with torch.inference_mode():
        ctx = smollm_int4.context(torch.arange(len(ids)))
        h = smollm_int4.embed(ids, ctx)
        hidden = {}
        for j in range(smollm_int4.num_layers):
            h = smollm_int4.run_layer(j, h, ctx, None)
            hidden[j + 1] = h[0]
        for e in method.native.layers:
            expected = method.policy.scores(e, hidden[e])
            got = torch.tensor([method.native.probability(engine.native.dims, e, row, engine.final_norm_weight,
                                                          smollm_int4.num_layers) for row in hidden[e]])
            # the classifier's features are rounded to bfloat16 as the model rounds its final norm:
            # the norm's sum, added in another order, moves a feature by a bfloat16 step now and then
            torch.testing.assert_close(got, expected.float(), atol=1e-3, rtol=0)
            assert (got - expected).abs().median() < 1e-6
    assert method.native.layers == [e for e in heads.layers]


@pytest.mark.parametrize("spec", ["classifier@1.0", "rl@1.0", "static@30", "classifier/kv=propagate@1.0",
                                  "classifier/kv=propagate/emit=short@1.0"])
def test_strictest_thresholds_give_baselines_tokens_in_one_native_call_a_token(smollm_int4, spec, monkeypatch):
    calls = []
    run_exit = smollm_int4.run_exit
    monkeypatch.setattr(smollm_int4, "run_exit", lambda *a: calls.append(1) or run_exit(*a))
    params = GenerationParams(max_new_tokens=12)
    for text in stdlib_prompts(6)[:2]:
        ids = ids_of(smollm_int4, text)
        base = Baseline().generate(smollm_int4, ids, params)
        calls.clear()
        ours = make_method(f"early-exit:{spec}", smollm_int4).generate(smollm_int4, ids, params)
        assert ours.token_ids == base.token_ids
        assert set(ours.stats.token_sources) == {"full"}
        assert len(calls) == len(ours.stats.token_layers) - 1  # every step after the prefill's token


def test_an_exit_decided_natively_counts_its_checks(smollm_int4):
    """rl@0.0 exits at the first check: one check's work a token, as the Python loop counts it."""
    ids = ids_of(smollm_int4, "x = 1\ny = 2\nz =")
    params = GenerationParams(max_new_tokens=6)
    method = make_method("early-exit:rl/kv=propagate@0.0", smollm_int4)
    native = method.generate(smollm_int4, ids, params)
    method.native = None
    python = method.generate(smollm_int4, ids, params)
    first = min(method.exits)
    assert native.stats.token_layers == python.stats.token_layers == [30] + [first] * 5
    assert native.stats.decision_macs == python.stats.decision_macs == 5 * method.policy.decision_macs()
    assert native.stats.layer_evals == pytest.approx(python.stats.layer_evals)
    assert native.token_ids == python.token_ids


def test_an_exit_with_emit_short_chooses_from_the_shortlist_and_skips_the_full_head(smollm_int4):
    """`emit=short`: an exited token's logits are the shortlist head's on the translated exit state
    (the frequency-ranked rows plus the request's tokens), -inf for every other token, and the
    full head runs only for the prefill's token; the token is the full exit head's wherever that
    one's top token is in the list."""
    ids = ids_of(smollm_int4, stdlib_prompts(6)[3])
    params = GenerationParams(max_new_tokens=12)
    short = make_method("early-exit:static/kv=propagate/emit=short/short=2048@20", smollm_int4)
    full = make_method("early-exit:static/kv=propagate@20", smollm_int4)
    out = short.generate(smollm_int4, ids, params)
    assert out.stats.token_layers == [30] + [20] * 11
    assert out.stats.head_evals == 1
    shortlist = short.shortlist.for_request()
    shortlist.grow(ids)
    ranked, ends = shortlist.base.ids[:2048], set(shortlist.base.ids[2048:])
    assert ranked != list(range(2048))  # ranked, not the lowest ids
    assert ends == eos_ids_of(smollm_int4) - set(ranked) and ends  # then the end tokens the ranking lacks
    tokens = out.token_ids
    cache, stats = smollm_int4.new_cache(), Stats()
    smollm_int4.forward(torch.tensor(ids), cache)
    with torch.inference_mode():
        for k, token in enumerate(tokens[:-1]):
            shortlist.grow([token])
            logits, depth, _ = short.step(smollm_int4, token, len(ids) + k, cache, [], stats, None, shortlist)
            hidden = logits.isfinite()
            assert depth == 20 and set(hidden.nonzero().flatten().tolist()) == set(shortlist.index.tolist())
            assert int(logits.argmax()) == tokens[k + 1]
    reference = full.generate(smollm_int4, ids, params).token_ids
    members = set(shortlist.index.tolist())
    same = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        same += 1
    assert same == len(tokens) or reference[same] not in members  # they part only at a token off the list


def test_the_check_cost_benchmark_times_a_check_and_a_layer(monkeypatch):
    from dyncomplete.bench import exit_cost

    monkeypatch.setattr(exit_cost, "CALLS", 20)
    r = exit_cost.measure("smollm2-135m", "classifier", runs=1)
    assert r["check_bytes"] == 4 * (576 * 64 + 64 + 64 + 1)  # the classifier's float32 weights and biases
    assert 0 < r["check_us"] and 0 < r["layer_us"] and r["layer_bytes"] > 10 * r["check_bytes"]
