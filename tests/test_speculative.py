"""Speculative decoding is lossless: greedy output identical to `baseline` (float32, and
bfloat16 for `lookup`) on real prompts, speculative sampling keeps the sampling distribution, the
cache ends as plain decoding leaves it, and no layer runs twice for an accepted token."""

import dataclasses
import sysconfig
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare
from helpers import rows_may_depend_on_count, stdlib_prompts

from dyncomplete import methods
from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline
from dyncomplete.engine.sampling import sampling_probs
from dyncomplete.methods.datastore import Datastore
from dyncomplete.methods.proposers import DraftModelProposer, LookupProposer, RetrievalProposer, SelfDraftProposer
from dyncomplete.methods.speculative import SpeculativeDecoding
from dyncomplete.methods.verify import Draft, accept_sampled, accept_tree
from dyncomplete.exits.heads import lens_heads, load_heads
from dyncomplete.models import load

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def prompts(smollm):
    """16 real prompts: 15 standard-library cuts + one more, shorter cut."""
    texts = stdlib_prompts(15) + stdlib_prompts(1, chars=200)
    return [smollm.tokenizer(t, add_special_tokens=False).input_ids for t in texts]


@pytest.fixture(scope="module")
def reference(smollm, prompts):
    return [Baseline().generate(smollm, ids, GenerationParams(max_new_tokens=NEW_TOKENS)).token_ids for ids in prompts]


def identical(method, model, prompts, reference):
    stats = []
    for ids, want in zip(prompts, reference):
        out = method.generate(model, ids, GenerationParams(max_new_tokens=NEW_TOKENS))
        assert out.token_ids == want, model.tokenizer.decode(ids[-30:])
        stats.append(out.stats)
    return stats


@pytest.mark.model
@pytest.mark.parametrize("name", ["lookup", "self-spec", "self-spec:dynamic", "lookup+self"])
def test_greedy_identical_to_baseline_on_16_prompts(name, smollm, prompts, reference):
    """16 prompts for lookup and self-spec's proposers, each alone; their combinations on 8
    (`self-spec:dynamic`: self-spec's proposer under another draft control; `lookup+self`: lookup
    first, self-drafting where it finds nothing), which keeps the suite within CI's time."""
    assert len(prompts) == 16
    n = 8 if name in ("self-spec:dynamic", "lookup+self") else 16
    stats = identical(methods.make_method(name, smollm), smollm, prompts[:n], reference[:n])
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted > 0 and 0 < accepted <= drafted  # the proposer really drafted, and some landed


@pytest.mark.model
@pytest.mark.parametrize("name", ["stand", "stand:10/tree"])
def test_stand_greedy_identical_to_baseline(name, smollm, prompts, reference):
    """STAND's chains and trees on the first 10 prompts (token trees are verified on 16 with retrieval's)."""
    stats = identical(methods.make_method(name, smollm), smollm, prompts[:10], reference[:10])
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted > 0 and 0 < accepted <= drafted


@pytest.fixture(scope="module")
def stdlib_store(smollm):
    """A datastore of the standard library's top-level modules, the prompts' files among them: many
    long drafts, so identity is tested where most drafted tokens land."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.py"))[:120]]
    return Datastore.build([smollm.tokenizer(t, add_special_tokens=False).input_ids for t in texts],
                           separator=len(smollm.tokenizer))


@pytest.mark.model
@pytest.mark.parametrize("tree", [True, False])
def test_retrieval_greedy_identical_to_baseline_on_16_prompts(tree, smollm, prompts, reference, stdlib_store):
    """Trees on all 16 prompts; chains (verified as lookup's are) on the first 8."""
    n = 16 if tree else 8
    stats = identical(SpeculativeDecoding(RetrievalProposer(stdlib_store, tree=tree)), smollm, prompts[:n],
                      reference[:n])
    from_store = [c for s in stats for source, c in s.by_source.items() if "datastore" in source]
    steps, drafted, accepted = (sum(c[i] for c in from_store) for i in range(3))
    assert steps > 0 and accepted > 0.1 * drafted  # the store drafted, and a good share landed
    if tree:  # several candidates a step, and accepted paths longer than one token
        assert drafted > 1.5 * steps and max(len(s.accepted_per_position) for s in stats) > 2


BF16_PROMPTS = 10  # bfloat16 identity rests on the products (models/invariant.py), not on the proposers


@pytest.fixture(scope="module")
def reference_bf16(smollm_bf16, prompts):
    return [Baseline().generate(smollm_bf16, ids, GenerationParams(max_new_tokens=NEW_TOKENS)).token_ids
            for ids in prompts[:BF16_PROMPTS]]


@pytest.mark.model
def test_retrieval_tree_identical_in_bfloat16(smollm_bf16, prompts, reference_bf16, stdlib_store, request):
    """Token trees, the widest passes, on the first 10 prompts: their 16 are in float32 above, and
    test_invariant.py checks the bfloat16 rows alone against a verification pass directly."""
    rows_may_depend_on_count(request, smollm_bf16)
    identical(SpeculativeDecoding(RetrievalProposer(stdlib_store, tree=True)), smollm_bf16, prompts[:BF16_PROMPTS],
              reference_bf16)


@pytest.mark.model
def test_greedy_identical_to_baseline_in_bfloat16_too(smollm_bf16, prompts, reference_bf16, request):
    """The default dtype on CPUs with bfloat16 instructions: lookup's chains on the same 10 prompts."""
    rows_may_depend_on_count(request, smollm_bf16)
    identical(methods.make_method("lookup", smollm_bf16), smollm_bf16, prompts[:BF16_PROMPTS], reference_bf16)


@pytest.mark.model
def test_draft_model_drafting_for_itself_is_always_accepted(smollm, prompts, reference):
    """On the first 10 prompts: acceptance, not identity, is the point (identity has its 16 above)."""
    twin = load("smollm2-135m", dtype="float32", progress=lambda m: None)
    method = SpeculativeDecoding(DraftModelProposer(twin, smollm, max_draft=4))
    stats = identical(method, smollm, prompts[:10], reference[:10])
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted > 0 and accepted / drafted > 0.97  # same weights: only float near-ties differ


@pytest.mark.model
def test_the_draft_model_loads_in_the_targets_dtype_and_weight_format(smollm, monkeypatch):
    """An int4 target with a bfloat16 draft model ran the draft on PyTorch's kernels, slower than
    the target's own step (0.34x on Qwen2.5-Coder-1.5B)."""
    asked = {}
    monkeypatch.setattr("dyncomplete.methods.speculative.load", lambda name, **kw: asked.update(kw, name=name) or smollm)
    methods.make_method("draft-model:smollm2-135m/2", smollm)
    assert asked["name"] == "smollm2-135m" and asked["quant"] == smollm.quant
    assert asked["dtype"] == str(smollm.dtype).removeprefix("torch.")


@pytest.mark.model
def test_draft_model_tree_keeps_the_baseline_output_and_lands_runner_ups(smollm, prompts, reference):
    """The LITE-tuned SmolLM2 (same tokenizer, other weights) drafts for the base model as a tree:
    its greedy chain plus its runner-up tokens beside it, on the first 8 prompts."""
    lite = load("smollm2-135m-lite", dtype="float32", progress=lambda m: None)
    proposer = DraftModelProposer(lite, smollm, max_draft=4, tree=True)
    landed = []  # per step: whether an accepted token was a runner-up (a node beside a chain node)
    feedback = proposer.feedback

    def record(draft, accepted):
        parents = draft.parents
        landed.append(any(i > 0 and parents[i] == parents[i - 1] for i in draft.accepted))
        feedback(draft, accepted)

    proposer.feedback = record
    stats = identical(SpeculativeDecoding(proposer), smollm, prompts[:8], reference[:8])
    assert sum(s.drafted for s in stats) > sum(s.accepted for s in stats) > 0
    assert any(landed)


@pytest.mark.model
def test_cache_matches_plain_decoding_and_no_layer_runs_twice(smollm, prompts, monkeypatch):
    ids = prompts[0]
    params = GenerationParams(max_new_tokens=NEW_TOKENS)
    plain = smollm.new_cache()
    want = Baseline().generate(smollm, ids, params, cache=plain)
    runs = []
    engine = smollm.engines[smollm.engine]  # every layer evaluation, alone or in a run of layers, ends here
    real = engine.run_layer
    monkeypatch.setattr(engine, "run_layer", lambda i, h, ctx, c: runs.append(h.shape[1]) or real(i, h, ctx, c))
    cache = smollm.new_cache()
    method = SpeculativeDecoding(SelfDraftProposer(lens_heads(smollm, [20]), 20, max_draft=3))
    out = method.generate(smollm, ids, params, cache=cache)
    assert out.token_ids == want.token_ids
    s = out.stats
    decoded = sum(runs) - len(ids) * smollm.num_layers  # layer evaluations after the prefill
    # each step runs k+1 positions through all L layers: 20 while drafting, 10 while verifying
    assert decoded == smollm.num_layers * (s.drafted + s.verify_steps) == s.layer_evals - smollm.num_layers
    # every layer of the cache holds the prompt and the emitted tokens (all but the last, which
    # plain decoding never runs either) with the keys plain decoding computed
    n = len(ids) + len(want.token_ids) - 1
    assert len(set(cache.lengths)) == 1 and cache.lengths[0] >= n
    for layer in (0, 19, 20, 29):
        assert torch.allclose(cache.layer_keys(layer)[..., :n, :], plain.layer_keys(layer)[..., :n, :], atol=1e-4)


def markov_logits(table, first, tokens):
    """Target logits of a toy two-step chain: row 0 = first, row i = table[tokens[i-1]]."""
    rows = [first] + [table[t] for t in tokens]
    return torch.stack(rows).log()


@pytest.mark.parametrize("draft_kind", ["sampled", "point-mass"])
def test_speculative_sampling_preserves_the_distribution(draft_kind):
    """Two tokens from a toy chain, drafted by a different chain (or a fixed guess), accepted by
    `accept_sampled`: their joint frequency must match the target's, temperature and top-p
    included (chi-square, 36 cells, 12k draws; a verifier that accepted blindly fails it)."""
    gen = torch.Generator().manual_seed(0)
    vocab = 6
    params = GenerationParams(temperature=0.8, top_p=0.95)
    p_first = torch.softmax(torch.randn(vocab, generator=gen), 0)
    p_table = torch.softmax(torch.randn(vocab, vocab, generator=gen), 1)
    q_first = torch.softmax(torch.randn(vocab, generator=gen), 0)
    q_table = torch.softmax(torch.randn(vocab, vocab, generator=gen), 1)
    target_first = sampling_probs(p_first.log(), params)
    expected = target_first[:, None] * torch.stack([sampling_probs(p_table[a].log(), params) for a in range(vocab)])
    counts = torch.zeros(vocab, vocab)
    draws = 12000
    for _ in range(draws):
        if draft_kind == "sampled":
            d1 = int(torch.multinomial(q_first, 1, generator=gen))
            d2 = int(torch.multinomial(q_table[d1], 1, generator=gen))
            probs = torch.stack([q_first, q_table[d1]])
        else:
            d1, d2, probs = 2, 4, None
        logits = markov_logits(p_table, p_first, [d1, d2])
        n, nxt = accept_sampled(logits, [d1, d2], probs, params, gen)
        out = [d1, d2][:n] + [nxt]
        if len(out) == 1:  # one token only: the second comes from a plain step after it
            out.append(int(torch.multinomial(sampling_probs(p_table[out[0]].log(), params), 1, generator=gen)))
        counts[out[0], out[1]] += 1
    keep = expected.reshape(-1) > 0
    observed, want = counts.reshape(-1)[keep], expected.reshape(-1)[keep] * draws
    assert observed.sum() == draws and counts.reshape(-1)[~keep].sum() == 0  # top-p cut respected
    assert chisquare(observed.numpy(), want.numpy() * observed.sum().item() / want.sum().item()).pvalue > 1e-3


def test_tree_acceptance_preserves_the_distribution():
    """Two tokens from a toy chain, drafted as a tree (two first tokens, one of them with a child),
    accepted by `accept_tree`: the joint frequency must match the target's (chi-square, 12k draws)."""
    gen = torch.Generator().manual_seed(1)
    vocab = 6
    params = GenerationParams(temperature=0.8, top_p=0.95)
    p_first = torch.softmax(torch.randn(vocab, generator=gen), 0)
    p_table = torch.softmax(torch.randn(vocab, vocab, generator=gen), 1)
    target_first = sampling_probs(p_first.log(), params)
    expected = target_first[:, None] * torch.stack([sampling_probs(p_table[a].log(), params) for a in range(vocab)])
    draft = Draft([2, 4, 1], parents=[-1, -1, 0])
    logits = torch.stack([p_first, p_table[2], p_table[4], p_table[1]]).log()
    counts = torch.zeros(vocab, vocab)
    draws = 12000
    for _ in range(draws):
        path, nxt = accept_tree(logits, draft, params, gen)
        out = [draft.tokens[i] for i in path] + [nxt]
        if len(out) == 1:
            out.append(int(torch.multinomial(sampling_probs(p_table[out[0]].log(), params), 1, generator=gen)))
        counts[out[0], out[1]] += 1
    keep = expected.reshape(-1) > 0
    observed, want = counts.reshape(-1)[keep], expected.reshape(-1)[keep] * draws
    assert counts.reshape(-1)[~keep].sum() == 0
    assert chisquare(observed.numpy(), want.numpy() * observed.sum().item() / want.sum().item()).pvalue > 1e-3


def test_greedy_tree_acceptance_follows_the_argmax_through_the_tree():
    draft = Draft([2, 4, 1, 3], parents=[-1, -1, 0, 0])
    rows = torch.full((5, 6), -5.0)
    for row, best in enumerate([2, 1, 0, 5, 0]):  # root -> 2 -> (2, 1) -> 5, not drafted
        rows[row, best] = 5.0
    assert accept_tree(rows, draft, GenerationParams(), None) == ([0, 2], 5)
    rows[0] = -5.0
    rows[0, 3] = 5.0  # the root's choice is no child: nothing accepted, the model's token comes next
    assert accept_tree(rows, draft, GenerationParams(), None) == ([], 3)


@pytest.mark.model
def test_sampled_speculation_is_reproducible_with_a_seed(smollm, prompts):
    method = methods.make_method("lookup+self", smollm)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0.7, seed=3)
    a = method.generate(smollm, prompts[1], params)
    b = method.generate(smollm, prompts[1], params)
    assert a.token_ids == b.token_ids and a.stats.verify_steps > 0


@pytest.mark.model
def test_lookup_accepts_repeated_code_and_reports_acceptance(smollm):
    text = "".join(f"    def get_{f}(self):\n        return self._{f}\n\n" for f in ("name", "age", "city", "email"))
    text += "    def get_"  # the model goes on with another getter of the same shape
    ids = smollm.tokenizer(text, add_special_tokens=False).input_ids
    out = SpeculativeDecoding(LookupProposer()).generate(smollm, ids, GenerationParams(max_new_tokens=20))
    s = out.stats
    assert out.token_ids == Baseline().generate(smollm, ids, GenerationParams(max_new_tokens=20)).token_ids
    assert s.accepted >= 6 and s.verify_steps < s.new_tokens  # several tokens per verification
    assert sum(s.drafted_per_position) == s.drafted and s.accepted_per_position[0] <= s.drafted_per_position[0]
    assert 0 < s.token_sources.count("draft") <= s.accepted  # the last step may end mid-draft


@pytest.mark.model
def test_method_names(smollm):
    assert methods.make_method("lookup:5", smollm).proposer.max_draft == 5
    layer = load_heads(smollm).layers[0]
    fixed = methods.make_method(f"self-spec:{layer}/3", smollm).proposer
    assert (fixed.layer, fixed.max_draft) == (layer, 3)
    assert methods.make_method("self-spec:dynamic@0.7", smollm).proposer.stop.threshold == 0.7
    for bad in ("self-spec:31", f"self-spec:{layer}@0.5", "lookup:x", "lookup:4/2", "draft-model:"):
        with pytest.raises(ValueError):
            methods.make_method(bad, smollm)


@pytest.mark.model
def test_drafts_from_an_earlier_completion_keep_the_baseline_output(smollm):
    """The cross-request n-gram cache: with the first completion as history, a second request of
    another prompt drafts from it and still gives the baseline's tokens."""
    params = GenerationParams(max_new_tokens=24)
    first = smollm.tokenizer("def area(width, height):\n    return", add_special_tokens=False).input_ids
    earlier = Baseline().generate(smollm, first, params).token_ids
    again = smollm.tokenizer("def size(width, height):\n    return", add_special_tokens=False).input_ids
    with_history = dataclasses.replace(params, history=tuple(earlier))
    out = SpeculativeDecoding(LookupProposer()).generate(smollm, again, with_history)
    assert out.token_ids == Baseline().generate(smollm, again, params).token_ids
    assert out.stats.by_source.get("history", [0, 0, 0])[2] > 0  # tokens accepted from the history
