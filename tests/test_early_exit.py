"""Early exit: exact at the strictest threshold, exact caches after catch-up, propagated caches
and shallow prompts (`prompt=L`) equal to references built with the real decoder layers, and
honest work counts."""

import pytest
import torch
from helpers import ids_of, stdlib_prompts

from dyncomplete.engine import GenerationParams, Stats
from dyncomplete.methods.baseline import Baseline
from dyncomplete.methods.early_exit import EarlyExit
from dyncomplete.exits.heads import lens_heads
from dyncomplete.exits.policies import make_policy
from dyncomplete.methods import make_method

pytestmark = pytest.mark.model


class Never:
    """A policy that never exits (the deep token of the cache tests)."""

    needs_logits = False

    def reset(self):
        pass

    def decision_macs(self):
        return 0.0

    def decide(self, e, hidden, logits):
        return False


@pytest.mark.parametrize("spec", ["confidence@1.0", "entropy@0", "saturation@1.0", "static@30",
                                  "classifier@1.0/line=2"])
def test_strictest_threshold_is_the_baseline(smollm, spec):
    params = GenerationParams(max_new_tokens=16)
    for text in stdlib_prompts(8)[:2]:
        ids = ids_of(smollm, text)
        base = Baseline().generate(smollm, ids, params)
        ours = make_method(f"early-exit:{spec}", smollm).generate(smollm, ids, params)
        assert ours.token_ids == base.token_ids
        assert set(ours.stats.token_sources) == {"full"}
        assert ours.stats.layer_evals == base.stats.layer_evals


def run_exits(model, method, ids, tokens):
    """Prefill `ids`, then feed `tokens` through method.step with the method's own policy."""
    cache, stats = model.new_cache(), Stats()
    model.forward(torch.tensor(ids), cache)
    pending, depths = [], []
    with torch.inference_mode():
        for k, token in enumerate(tokens):
            _, depth, pending = method.step(model, token, len(ids) + k, cache, pending, stats)
            depths.append(depth)
    return cache, pending, stats, depths


def test_catch_up_leaves_an_exact_cache(smollm):
    ids = ids_of(smollm, "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n")
    tokens = ids_of(smollm, "    return a * b\n")[:5]
    heads = lens_heads(smollm, [10, 20])
    # exit at 20, then at 10 (resume layers 20, 10, ... never increase), then a deep token
    method = EarlyExit(heads, make_policy("static", 10, smollm, heads))
    cache, pending, stats, depths = run_exits(smollm, EarlyExit(heads, make_policy("static", 20, smollm, heads)), ids, tokens[:2])
    assert depths == [20, 20] and len(pending) == 2
    with torch.inference_mode():
        _, d, pending = method.step(smollm, tokens[2], len(ids) + 2, cache, pending, stats)
        assert d == 10 and [r for r, _ in pending] == [20, 20, 10]
        method.policy = Never()
        logits, d, pending = method.step(smollm, tokens[3], len(ids) + 3, cache, pending, stats)
    assert d == smollm.num_layers and pending == [] and set(cache.lengths) == {len(ids) + 4}
    reference = smollm.forward(torch.tensor(ids + tokens[:4]))[0, -1]
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)
    # every skipped layer ran once, later: 30 + 20 + 20 + 10 on the steps, 10+10+20 caught up
    assert stats.layer_evals == 20 + 20 + 10 + 30 + (10 + 10 + 20)


def test_propagation_matches_a_reference_built_with_the_real_layers(smollm):
    ids = ids_of(smollm, "import os\nimport sys\n\nfor name in os.listdir(")
    tokens = ids_of(smollm, "path):\n    print(name)")[:4]
    heads = lens_heads(smollm, [18])
    method = EarlyExit(heads, make_policy("static", 18, smollm, heads), kv="propagate")
    cache, pending, stats, depths = run_exits(smollm, method, ids, tokens[:3])
    assert depths == [18, 18, 18] and pending == [] and set(cache.lengths) == {len(ids) + 3}
    method.policy = Never()
    with torch.inference_mode():
        logits, _, _ = method.step(smollm, tokens[3], len(ids) + 3, cache, [], stats)
        # reference: the full decoder layers >= 18 run on the exit hidden state; their outputs
        # are dropped, only the keys/values they append stay
        ref = smollm.new_cache()
        smollm.forward(torch.tensor(ids), ref)
        for k, token in enumerate(tokens[:3]):
            ctx = smollm.context(torch.tensor([len(ids) + k]))
            h = smollm.embed(torch.tensor([token]), ctx)
            for j in range(18):
                h = smollm.run_layer(j, h, ctx, ref)
            for j in range(18, smollm.num_layers):
                smollm.run_layer(j, h, ctx, ref)
        expected = smollm.forward(torch.tensor([tokens[3]]), ref)[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    full = smollm.forward(torch.tensor(ids + tokens[:4]))[0, -1]
    assert not torch.allclose(logits, full, atol=1e-3)  # propagation is an approximation


def test_a_shallow_prompt_matches_a_reference_built_with_the_real_layers(smollm):
    """prompt=18: the prompt's positions but its last run layers below 18, and the real layers
    from 18 on, run on their state there, leave the keys and values (outputs dropped); the last
    position runs every layer over them."""
    ids = ids_of(smollm, "import os\nimport sys\n\nfor name in os.listdir(path):\n    print(")
    method = make_method("early-exit:static@18/kv=propagate/prompt=18", smollm)
    cache = smollm.new_cache()
    with torch.inference_mode():
        logits = method.prompt_pass(smollm, ids, cache, last=True)
        ref = smollm.new_cache()
        ctx = smollm.context(torch.arange(len(ids) - 1))
        h = smollm.embed(torch.tensor(ids[:-1]), ctx)
        for j in range(smollm.num_layers):
            out = smollm.run_layer(j, h, ctx, ref)
            h = out if j < 18 else h
        expected = smollm.forward(torch.tensor(ids[-1:]), ref)[0, -1]
    assert cache.lengths == [len(ids)] * smollm.num_layers
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits, smollm.forward(torch.tensor(ids))[0, -1], atol=1e-3)  # an approximation


def test_after_its_first_token_a_static_exit_reads_no_prompt_layer_above_it(smollm):
    """static@18 with prompt=18: every token after the first is the one static@18 gives over the
    full prompt's cache, whose layers from 18 on are exact instead of projected."""
    ids = ids_of(smollm, "def mean(values):\n    total = 0\n    for v in values:\n")
    out = make_method("early-exit:static@18/kv=propagate/prompt=18", smollm).generate(
        smollm, ids, GenerationParams(max_new_tokens=8))
    static = make_method("early-exit:static@18/kv=propagate", smollm)
    cache, pending, stats = smollm.new_cache(), [], Stats()
    smollm.forward(torch.tensor(ids), cache)
    with torch.inference_mode():
        for k, token in enumerate(out.token_ids[:-1]):
            logits, depth, pending = static.step(smollm, token, len(ids) + k, cache, pending, stats)
            assert depth == 18 and int(logits.argmax()) == out.token_ids[k + 1], k


def test_a_shallow_prompt_gives_the_same_bits_in_chunks(smollm_int4):
    """A cancellable request prefills in chunks of PREFILL_CHUNK: the same tokens as in one part."""
    ids = ids_of(smollm_int4, stdlib_prompts(8)[0])
    method = make_method("early-exit:classifier@0.9/kv=propagate/prompt=20", smollm_int4)
    params = GenerationParams(max_new_tokens=12)
    assert len(ids) > 2 * 32 and method.prompt_depth == 20
    whole = method.generate(smollm_int4, ids, params)
    chunked = method.generate(smollm_int4, ids, params, cancelled=lambda: False)
    assert chunked.token_ids == whole.token_ids and whole.stats.prompt_tokens == len(ids)
    assert make_method("early-exit:classifier/prompt=20@0.9+stop:0.9", smollm_int4).prompt_depth == 20


def test_counts_heads_and_exits(smollm):
    ids = ids_of(smollm, "x = 1\ny = 2\nz =")
    out = make_method("early-exit:static@20/lens", smollm).generate(smollm, ids, GenerationParams(max_new_tokens=6))
    s = out.stats
    assert s.token_layers == [30] + [20] * 5 and s.token_sources == ["full"] + ["exit"] * 5
    assert s.layer_evals == 30 + 5 * 20 and s.head_evals == 6


def test_a_line_runs_at_the_depth_its_first_tokens_reached(smollm):
    """line=2: the policy decides a line's first two decoded tokens, the rest of the line runs to
    the deeper of their two depths with no checks; the next line decides again."""
    ids = ids_of(smollm, "import os\n\n\ndef list_files(path):\n    names = []\n    for")
    params = GenerationParams(max_new_tokens=48)
    free = make_method("early-exit:classifier@0.9", smollm).generate(smollm, ids, params)
    out = make_method("early-exit:classifier@0.9/line=2", smollm).generate(smollm, ids, params)
    texts = [smollm.tokenizer.decode([t]) for t in out.token_ids]
    depths = out.stats.token_layers  # depths[i]: the layers that gave token i (0: the prompt's pass)
    decided, fixed = [], 0
    for i in range(1, len(depths)):
        if "\n" in texts[i - 1]:
            decided = []
        if len(decided) < 2:
            decided.append(depths[i])
        else:
            assert depths[i] == max(decided), (i, texts[i], depths[i], decided)
            fixed += 1
    assert fixed > 20 and "\n" in "".join(texts[:-3])  # lines long enough to be fixed, several lines
    # per token the same classifier exits at several depths along one line; per line it cannot
    assert len(set(free.stats.token_layers[1:6])) > 1


def test_bad_names_are_refused(smollm):
    with pytest.raises(ValueError, match="unknown exit policy"):
        make_method("early-exit:nonsense@0.5", smollm)
    with pytest.raises(ValueError, match="threshold"):
        make_method("early-exit:confidence", smollm)
    with pytest.raises(ValueError, match="kv"):
        make_method("early-exit:confidence@0.5/kv=magic", smollm)
    with pytest.raises(ValueError, match="no exit layer"):
        make_method("early-exit:confidence@0.5/min=29", smollm)
    assert make_method("early-exit:confidence@0.5/min=24", smollm).exits == {24, 26, 28}
    with pytest.raises(ValueError, match="without an exit head: \\[25\\]"):
        make_method("early-exit:confidence@0.5/at=24.25", smollm)
    with pytest.raises(ValueError, match="dots between them"):
        make_method("early-exit:confidence@0.5/at=24-26", smollm)
    assert make_method("early-exit:classifier@0.5/at=20.26", smollm).exits == {20, 26}
    with pytest.raises(ValueError, match="emit must be full or short"):
        make_method("early-exit:static@24/emit=tiny", smollm)
    with pytest.raises(ValueError, match="emit=short needs a shortlist head"):
        make_method("early-exit:static@24/emit=short/short=0", smollm)
    with pytest.raises(ValueError, match="line takes the number of tokens"):
        make_method("early-exit:classifier@0.9/line=0", smollm)
    with pytest.raises(ValueError, match="line takes a number of tokens"):
        make_method("early-exit:classifier@0.9/line=two", smollm)
    for bad in ("0", "30", "abc"):
        with pytest.raises(ValueError, match="prompt takes a layer"):
            make_method(f"early-exit:static@20/prompt={bad}", smollm)


def test_shortlist_decisions_are_confirmed_by_the_full_head_and_cost_less(smollm):
    """Logit policies decide on 4096 head rows plus the request's tokens and confirm an exit with
    the full head. Fed the same tokens, a token never exits earlier than with the full head at
    every check (the shortlist can only refuse an exit: where the full head's top token is in
    neither list), nearly always at the same layer, for a fraction of the deciding work."""
    text = stdlib_prompts(8)[0]
    ids = ids_of(smollm, text)
    tokens = Baseline().generate(smollm, ids, GenerationParams(max_new_tokens=40)).token_ids
    for spec in ("confidence@0.6", "margin@0.5"):
        runs = []
        for option in ("/short=0", ""):
            method = make_method(f"early-exit:{spec}{option}", smollm)
            shortlist = method.shortlist.for_request() if method.shortlist else None
            if shortlist:
                shortlist.grow(ids)
            cache, stats, pending, depths = smollm.new_cache(), Stats(), [], []
            smollm.forward(torch.tensor(ids), cache)
            with torch.inference_mode():
                for k, token in enumerate(tokens):
                    if shortlist:
                        shortlist.grow([token])
                    _, depth, pending = method.step(smollm, token, len(ids) + k, cache, pending, stats, None, shortlist)
                    depths.append(depth)
            runs.append((depths, stats))
        (full, full_stats), (short, short_stats) = runs
        assert all(s >= f for s, f in zip(short, full)), (spec, full, short)
        assert sum(s == f for s, f in zip(short, full)) >= 0.9 * len(tokens) and min(full) < 30
        assert 0 < short_stats.decision_macs < full_stats.decision_macs / 3
    rows = make_method("early-exit:confidence@0.6", smollm).shortlist
    hidden = smollm.final_norm(torch.randn(2, smollm.hidden_size))
    torch.testing.assert_close(rows.logits(hidden), smollm.head(hidden).float()[:, rows.index], rtol=1e-4, atol=1e-4)


def test_the_default_models_shipped_agent_gives_baselines_tokens_at_its_strictest(qwen05):
    ids = ids_of(qwen05, "def area(r):\n    return 3.14 *")
    params = GenerationParams(max_new_tokens=8)
    base = Baseline().generate(qwen05, ids, params)
    strict = make_method("early-exit:rl@1.0", qwen05).generate(qwen05, ids, params)
    assert strict.token_ids == base.token_ids and set(strict.stats.token_layers) == {24}
    eager = make_method("early-exit:rl@0.0", qwen05).generate(qwen05, ids, params)
    assert eager.stats.token_layers[1:] == [16] * (len(eager.stats.token_layers) - 1)  # the first check layer
