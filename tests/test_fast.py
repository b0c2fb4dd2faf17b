"""The fast engine (models/fast.py): the same numbers as the Hugging Face modules on the same
weights, each position's logits independent of the positions computed with it (bfloat16, int8,
int4), and lossless speculative decoding on quantized weights."""

import copy
import glob
import json
import time

import pytest
import torch
from helpers import rows_may_depend_on_count, same_bits_alone_and_in_a_pass, stdlib_prompts, tiny_model

from dyncomplete import methods
from dyncomplete.engine import GenerationParams
from dyncomplete.engine.method import PREFILL_CHUNK
from dyncomplete.methods.baseline import Baseline
from dyncomplete.methods.verify import Draft, commit_path, score
from dyncomplete.models import LayeredModel, load
from dyncomplete.models.attention import SHORT_QUERY
from dyncomplete.models.fast import AMX_NATIVE_PROMPT, PROMPT_CHUNK
from dyncomplete.models.weights import Linear, quantize_levels
from dyncomplete.paths import cpu_has_bf16
from dyncomplete.models.verify_cost import measure_verify_cost


def long_ids(model, n=1200):
    """Over 1024 tokens of real code, so attention reductions are split in bfloat16 too."""
    source = max(glob.glob(torch.__file__.rsplit("/", 1)[0] + "/nn/modules/*.py"), key=lambda p: len(open(p).read()))
    return model.tokenizer(open(source).read()).input_ids[:n]


def run_steps(model, ids, start, engine):
    """Prompt pass, 4 one-token steps, a 6-token verification pass: every logit row."""
    model.set_engine(engine)
    try:
        cache = model.new_cache()
        out = [model.forward(torch.tensor(ids[:start]), cache, last_only=False)[0]]
        for k in range(4):
            out.append(model.forward(torch.tensor([ids[start + k]]), cache, start=start + k)[0])
        out.append(model.forward(torch.tensor(ids[start + 4 : start + 10]), cache, last_only=False)[0])
    finally:
        model.set_engine("fast")
    return torch.cat(out)


@pytest.mark.model
@pytest.mark.parametrize("fixture,start", [("smollm", 300), ("smollm_bf16", 1100)])
def test_fast_engine_computes_what_the_modules_compute_bit_for_bit(fixture, start, request):
    """Same model object, so the same weight memory (the modules hold views into the fused
    weights; float32 products depend on the weights' alignment, so a second load may differ in the
    last bits)."""
    model = request.getfixturevalue(fixture)
    assert model.engine == "fast"
    ids = long_ids(model)
    assert torch.equal(run_steps(model, ids, start, "fast"), run_steps(model, ids, start, "hf"))


@pytest.mark.model
def test_fast_engine_matches_a_separately_loaded_hf_model(smollm):
    """In float64 the engine's logits equal a separately loaded model's to well within anything a
    wrong weight, norm or rotary table would change. In float32 they are only compared by the
    tokens they choose: float32 logits there differ in the last bits with the CPU's kernels (up to
    3e-3 on one CI machine, 0 on the AMX Xeon)."""
    hf = load("smollm2-135m", dtype="float32", engine="hf", progress=lambda m: None)
    assert "fast" not in hf.engines
    prompts = [smollm.tokenizer(text, add_special_tokens=False).input_ids for text in stdlib_prompts(3)]
    params = GenerationParams(max_new_tokens=16)
    for ids in prompts:
        assert Baseline().generate(smollm, ids, params).token_ids == Baseline().generate(hf, ids, params).token_ids
    fast64 = LayeredModel(copy.deepcopy(hf.hf).double(), hf.tokenizer, name="smollm2-135m", engine="fast")
    assert fast64.engine == "fast"
    hf64 = hf.hf.double()
    for ids in prompts:
        with torch.no_grad():
            reference = hf64(torch.tensor([ids])).logits.float()
        torch.testing.assert_close(fast64.forward(torch.tensor(ids), last_only=False), reference, atol=2e-4, rtol=0)


@pytest.mark.model
def test_rotary_tables_equal_the_rotary_module(smollm_bf16):
    model = smollm_bf16
    rotary = model.core.rotary_emb
    probe = torch.empty(0, dtype=model.dtype)
    for positions in ([0], [5], [1023], [1024], [2047, 2048], list(range(700, 707)), list(range(0, 480))):
        cos, sin, _ = model.engines["fast"].rotary.at(positions)
        want_cos, want_sin = rotary(probe, torch.tensor([positions]))
        assert torch.equal(cos[None], want_cos) and torch.equal(sin[None], want_sin)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tiny_models_fast_equals_modules_and_hf_logits(kind):
    hf = tiny_model(kind)
    model = LayeredModel(hf)
    assert model.engine == "fast"
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = hf(ids).logits.float()
    torch.testing.assert_close(model.forward(ids, last_only=False), expected, rtol=1e-4, atol=1e-4)


def test_training_mode_and_wrapped_modules_fall_back_to_the_modules():
    model = LayeredModel(tiny_model("llama"))
    calls = []
    model.layers[0].register_forward_hook(lambda *a: calls.append(1))
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(5))
    model.forward(ids)
    assert calls == []  # inference: the fast engine, no module call
    model.hf.train()
    try:
        ctx = model.context(torch.arange(6))
        model.run_layer(0, model.embed(ids, ctx), ctx, None)
    finally:
        model.hf.eval()
    assert calls == [1]
    original = model.layers[0].self_attn.q_proj
    model.layers[0].self_attn.q_proj = torch.nn.Linear(32, 32, bias=False)  # as peft's wrappers do
    model.forward(ids)
    assert calls == [1, 1]
    model.layers[0].self_attn.q_proj = original


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (3072, 576), (49152, 576)])
def test_quantized_kernels_give_a_row_the_same_result_at_any_row_count(quant, shape):
    g = torch.Generator().manual_seed(shape[0])
    weight = (torch.randn(shape, generator=g) * 0.05).bfloat16()
    lin = Linear(weight, None, quant)
    x = torch.randn(SHORT_QUERY + 1, shape[1], generator=g).bfloat16()
    alone = [lin(x[r : r + 1])[0] for r in range(SHORT_QUERY)]
    for m in (2, 3, 4, 5, 6, 7, 8, 11, SHORT_QUERY):
        together = lin(x[:m])
        assert all(torch.equal(together[r], alone[r]) for r in range(m)), m
    # the kernel multiplies by the weight `dequantized` describes
    ref = x.float() @ lin.dequantized().float().t()
    torch.testing.assert_close(lin(x[:SHORT_QUERY]).float(), ref[:SHORT_QUERY], atol=0.05, rtol=0.02)
    # longer passes (prompts) take the plain weight (the engine stores the dequantized one there)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))


@pytest.mark.parametrize("quant, top", [("int4", 15), ("int8", 255)])
def test_quantization_error_is_small(quant, top):
    """Levels in range, and the dequantized weight within about half a level of the weight (the
    bfloat16 scale and zero add a little: at most 8 bits of mantissa)."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(6))
    levels, sz = quantize_levels(w, torch.float32, top.bit_length())
    assert levels.min() == 0 and levels.max() == top and sz.shape == (256 // 32, 64, 2)
    deq = Linear(w.bfloat16(), None, quant).dequantized().float()
    step = (w.reshape(64, 8, 32).amax(-1) - w.reshape(64, 8, 32).amin(-1)) / top  # each group's level
    assert ((deq - w).abs().reshape(64, 8, 32) <= 0.6 * step[..., None] + 4e-3 * w.abs().max()).all()
    with pytest.raises(ValueError, match=f"{quant} weights run in bfloat16"):
        Linear(w, None, quant)


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request):
    return load("smollm2-135m", dtype="bfloat16", quant=request.param, progress=lambda m: None)


@pytest.mark.model
def test_quantized_model_gives_a_position_the_same_logits_alone_or_in_a_verification_pass(quantized, request):
    rows_may_depend_on_count(request, quantized)
    model = quantized
    ids = long_ids(model)
    assert same_bits_alone_and_in_a_pass(model, ids) == [True] * 8


@pytest.mark.model
def test_all_layers_in_one_call_equal_one_call_per_layer(quantized):
    """`run_layers` (int4: one native call for the whole pass) against `run_layer` per layer, for
    a one-token step and a verification pass: the same logits and the same cache."""
    model = quantized
    ids = long_ids(model, 400)
    fused, stepped = model.new_cache(), model.new_cache()
    model.forward(torch.tensor(ids[:390]), fused)
    model.forward(torch.tensor(ids[:390]), stepped)
    for start, end in ((390, 391), (391, 396)):
        ctx = model.context(torch.arange(start, end))
        with torch.inference_mode():
            h = model.embed(torch.tensor(ids[start:end]), ctx)
            a = model.run_layers(0, h, ctx, fused)
            b = h
            for i in range(model.num_layers):
                b = model.run_layer(i, b, ctx, stepped)
        assert torch.equal(a, b)
    assert fused.lengths == stepped.lengths == [396] * model.num_layers
    assert all(torch.equal(fused.keys_by_feature(i, 0, 396), stepped.keys_by_feature(i, 0, 396)) for i in range(model.num_layers))


@pytest.mark.model
def test_a_short_chain_in_one_native_call_gets_the_bits_of_the_general_path(quantized):
    """`FastEngine.forward_chain` (embedding, layers, final norm and head in one call of decode.c)
    against `LayeredModel.forward`'s general path: the same logits and cache for one-token steps
    that outgrow the cache's buffers (their pointer arrays built again) and for a 5-token pass;
    a chain that does not follow the cache in every layer takes the general path."""
    model, engine = quantized, quantized.engines["fast"]
    assert engine.chains
    ids = long_ids(model, 300)

    def run(chains: bool):
        engine.chains = chains
        try:
            cache = model.new_cache()
            model.forward(torch.tensor(ids[:250]), cache)  # buffers of one SPAN: the steps grow them
            logits = [model.forward(torch.tensor([t]), cache) for t in ids[250:260]]
            return logits + [model.forward(torch.tensor(ids[260:265]), cache, last_only=False)], cache
        finally:
            engine.chains = True

    (chained, a), (general, b) = run(True), run(False)
    assert chained[-1].shape == (1, 5, model.vocab_size)
    assert all(torch.equal(x, y) for x, y in zip(chained, general))
    assert a.lengths == b.lengths == [265] * model.num_layers
    assert all(torch.equal(a.keys_by_feature(i, 0, 265), b.keys_by_feature(i, 0, 265))
               and torch.equal(a.values[i][0, :, :265], b.values[i][0, :, :265]) for i in range(model.num_layers))
    assert a.pointers.room >= 265 and a.pointers.keys == a.keys
    with torch.inference_mode():
        assert engine.forward_chain(torch.tensor([ids[265]]), a, 266, True) is None  # not the next position
        a.crop(264, range(1))
        assert engine.forward_chain(torch.tensor([ids[265]]), a, None, True) is None  # layers of two lengths
    with pytest.raises(IndexError):
        model.forward(torch.tensor([model.vocab_size + 5]), b)  # F.embedding's error, from the general path


@pytest.mark.model
def test_batched_chains_in_one_native_call_get_the_bits_of_the_general_path(quantized):
    """`FastEngine.forward_chains` against `forward_batch`'s general path (`run_batch`, then the
    head): three sequences, one of them outgrowing its buffers, a 20-token prompt part (more rows
    than the per-thread path takes) and a part whose logits nobody wants."""
    model, engine = quantized, quantized.engines["fast"]
    ids = long_ids(model, 300)

    def run(chains: bool):
        engine.chains = chains
        try:
            caches = [model.new_cache() for _ in range(3)]
            for cache, n in zip(caches, (255, 100, 40)):
                model.forward(torch.tensor(ids[:n]), cache)
            batches = [[(ids[255:257], caches[0], 255, 2), (ids[100:120], caches[1], 100, 1), (ids[40:43], caches[2], 40, 0)],
                       [(ids[257:258], caches[0], 257, 1), (ids[120:121], caches[1], 120, 1)]]
            return [model.forward_batch(steps) for steps in batches], caches
        finally:
            engine.chains = True

    (chained, a), (general, b) = run(True), run(False)
    assert [[None if x is None else tuple(x.shape) for x in out] for out in chained] == [
        [(2, model.vocab_size), (1, model.vocab_size), None], [(1, model.vocab_size), (1, model.vocab_size)]]
    assert all((x is None and y is None) or torch.equal(x, y)
               for out, ref in zip(chained, general) for x, y in zip(out, ref))
    for x, y, n in zip(a, b, (258, 121, 43)):
        assert x.lengths == y.lengths == [n] * model.num_layers
        assert all(torch.equal(x.keys_by_feature(i, 0, n), y.keys_by_feature(i, 0, n))
                   and torch.equal(x.values[i][0, :, :n], y.values[i][0, :, :n]) for i in range(model.num_layers))


@pytest.mark.model
def test_quantized_model_agrees_with_the_unquantized_one_on_most_greedy_tokens(quantized, request):
    """A quality floor: top-1 agreement over real code positions with the model `--quant none`
    runs on this CPU: bfloat16 where the CPU has bfloat16 instructions, float32 elsewhere (where
    bfloat16 products are emulated, and `--dtype auto` is float32 for unquantized weights).
    Over 1,653 positions (standard error of a share about 1%): int8 in groups of 32 agreed on 0.967,
    int4 on 0.874 (AMD Zen 4; PyTorch's per-channel int8 before it, 0.949 to 0.958 on three kinds)."""
    reference = request.getfixturevalue("smollm_bf16" if cpu_has_bf16() else "smollm")
    agree = total = 0
    for text in stdlib_prompts(16):
        ids = torch.tensor(reference.tokenizer(text, add_special_tokens=False).input_ids)
        a = quantized.forward(ids, last_only=False)[0].argmax(-1)
        b = reference.forward(ids, last_only=False)[0].argmax(-1)
        agree += int((a == b).sum())
        total += len(ids)
    assert agree / total > (0.95 if quantized.quant == "int8" else 0.8), agree / total


@pytest.mark.model
def test_lookup_is_identical_to_baseline_on_quantized_weights(quantized, request):
    rows_may_depend_on_count(request, quantized)
    model = quantized
    params = GenerationParams(max_new_tokens=16)
    drafted = 0
    for text in stdlib_prompts(6):
        ids = model.tokenizer(text, add_special_tokens=False).input_ids
        want = Baseline().generate(model, ids, params).token_ids
        out = methods.make_method("lookup", model).generate(model, ids, params)
        assert out.token_ids == want
        drafted += out.stats.drafted
    assert drafted > 0


@pytest.mark.model
@pytest.mark.parametrize("prompt", [17, 100, 2 * PROMPT_CHUNK + 44])
def test_a_prompt_through_decode_c_gets_the_bits_of_one_token_steps(quantized, prompt):
    """`native_prompt_max` None (the default except on CPUs with AMX): a prompt in chunks of PROMPT_CHUNK
    positions gives the last logits and the cache that feeding its tokens one at a time gives, on
    any CPU."""
    engine = quantized.engines["fast"]
    ids = long_ids(quantized, prompt)
    default = engine.native_prompt_max
    engine.native_prompt_max = None
    try:
        whole, stepped = quantized.new_cache(), quantized.new_cache()
        last = quantized.forward(torch.tensor(ids), whole)
        steps = [quantized.forward(torch.tensor([t]), stepped) for t in ids]
    finally:
        engine.native_prompt_max = default
    assert torch.equal(last, steps[-1])
    assert whole.lengths == stepped.lengths == [prompt] * quantized.num_layers
    assert all(torch.equal(whole.keys_by_feature(i, 0, prompt), stepped.keys_by_feature(i, 0, prompt)) and
               torch.equal(whole.values[i][0, :, :prompt], stepped.values[i][0, :, :prompt])
               for i in range(quantized.num_layers))


@pytest.mark.model
def test_with_amx_a_prompt_part_up_to_the_limit_runs_in_decode_c_and_joins_batches(quantized, monkeypatch):
    """Where the CPU has AMX, long prompts take oneDNN's GEMM, but parts of up to AMX_NATIVE_PROMPT
    positions (the server's parts of PREFILL_CHUNK) go through decode.c: one-token steps' bits,
    and a continuous batch may take them."""
    engine = quantized.engines["fast"]
    monkeypatch.setattr(engine, "native_prompt_max", AMX_NATIVE_PROMPT)
    ids = long_ids(quantized, 40 + PREFILL_CHUNK)
    whole, stepped = quantized.new_cache(), quantized.new_cache()
    quantized.fill(ids[:40], whole)
    last = quantized.forward(torch.tensor(ids[40:]), whole)
    steps = [quantized.forward(torch.tensor([t]), stepped) for t in ids]
    assert torch.equal(last, steps[-1])
    assert quantized.batchable(whole, len(ids), PREFILL_CHUNK)
    assert not quantized.batchable(whole, len(ids), AMX_NATIVE_PROMPT + 1)


@pytest.mark.model
def test_auto_dtype_is_bfloat16_for_native_kernels_on_a_cpu_without_bfloat16_instructions(monkeypatch):
    from dyncomplete.models import loading

    monkeypatch.setattr(loading, "resolve_dtype", lambda name, device="cpu": torch.float32 if name == "auto" else
                        loading.DTYPES[name])
    config = loading.cached_dir("smollm2-135m") / "config.json"
    pick = lambda **kw: loading.load_dtype(**({"dtype": "auto", "device": "cpu", "quant": "auto", "engine": "auto",
                                               "config": config} | kw))
    assert pick() == pick(quant="int4") == pick(quant="int8") == pick(engine="fast") == torch.bfloat16
    assert pick(quant="none") == pick(engine="hf") == pick(dtype="float32") == torch.float32


def test_quantization_needs_the_fast_engine():
    with pytest.raises(ValueError, match="fast engine"):
        LayeredModel(tiny_model("gpt2"), quant="int8")


class TimedModel:
    """A stand-in whose pass over k positions takes (FIXED + k * PER_POSITION) seconds: the cost
    measure must recover PER_POSITION / (FIXED + PER_POSITION) whatever the hardware. (How much
    more an extra position costs in int8/int4 than in bfloat16 depends on the CPU: 3x on an AMD EPYC,
    1.9x on the CI machine, so no test asserts a ratio between formats.)"""

    FIXED, PER_POSITION = 0.004, 0.002
    vocab_size = 1000

    class Cache:
        def crop(self, length):
            pass

    def new_cache(self):
        return self.Cache()

    def forward(self, ids, cache, last_only=True):
        time.sleep(self.FIXED + len(ids) * self.PER_POSITION)


def test_verify_cost_is_the_extra_time_per_position_over_a_one_token_pass():
    want = TimedModel.PER_POSITION / (TimedModel.FIXED + TimedModel.PER_POSITION)
    assert measure_verify_cost(TimedModel()) == pytest.approx(want, rel=0.15)


@pytest.mark.model
def test_lookup_drafts_with_the_verify_cost_measured_for_its_model(smollm_bf16, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNCOMPLETE_CACHE", str(tmp_path))
    method = methods.make_method("lookup", smollm_bf16)
    cached = json.loads((tmp_path / "verify_cost.json").read_text())
    assert list(cached.values()) == [method.proposer.verify_cost]
    assert "smollm2-135m|fast|none|bfloat16" in next(iter(cached))


def test_auto_weights_are_int4_only_for_the_fast_engine_in_bfloat16_on_the_cpu():
    from dyncomplete.models.fast import default_quant

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_quant("fast", cpu, torch.bfloat16) == "int4"
    assert default_quant("fast", cpu, torch.float32) == "none"
    assert default_quant("hf", cpu, torch.bfloat16) == "none"
    assert default_quant("fast", cuda, torch.bfloat16) == "none"


@pytest.mark.parametrize("fixture", ["smollm", "smollm_bf16"])
def test_a_token_tree_gives_each_row_the_logits_and_cache_of_its_own_chain(fixture, request):
    model = request.getfixturevalue(fixture)
    rows_may_depend_on_count(request, model)
    check_tree_against_chains(model)


@pytest.mark.model
def test_a_token_tree_on_quantized_weights_too(quantized, request):
    rows_may_depend_on_count(request, quantized)
    check_tree_against_chains(quantized)


def check_tree_against_chains(model):
    """One pass over a token tree (two branches, one of them forked again) against plain passes
    over each row's own chain: the same bits in bfloat16 (PyTorch's tree mask) and int4/int8
    (the native kernels' tree attention), where passes are batch-invariant by design; in float32,
    where SDPA's sums depend on the keys' count, within rounding. After `commit_path` the cache
    holds what the accepted branch's chain would have left."""
    same = torch.equal if model.dtype != torch.float32 else (
        lambda a, b: torch.allclose(a, b, atol=1e-4, rtol=1e-5) and a.argmax() == b.argmax())
    ids = long_ids(model, 400)
    start = 380
    tokens = [ids[381], 17, ids[382], 23, ids[383], 29]
    parents = [-1, -1, 0, 0, 2, 1]
    draft = Draft(tokens, parents=parents)
    base = model.new_cache()
    model.forward(torch.tensor(ids[:start]), base)
    tree_cache = base.copy()
    logits = score(model, tree_cache, ids[start], draft, start)
    for row in range(len(tokens) + 1):
        chain, node = [], row - 1
        while node >= 0:
            chain.insert(0, tokens[node])
            node = parents[node]
        cache = base.copy()
        want = model.forward(torch.tensor([ids[start]] + chain), cache, start=start, last_only=False)[0, -1]
        assert same(logits[row], want), row
    commit_path(tree_cache, start, [0, 2, 4])
    chain_cache = base.copy()
    model.forward(torch.tensor(ids[start : start + 4]), chain_cache, start=start, last_only=False)
    assert tree_cache.lengths == chain_cache.lengths == [start + 4] * model.num_layers
    for i in range(model.num_layers):
        assert same(tree_cache.keys_by_feature(i, 0, start + 4).flatten(), chain_cache.keys_by_feature(i, 0, start + 4).flatten())
        assert same(tree_cache.values[i][..., : start + 4, :].flatten(), chain_cache.values[i][..., : start + 4, :].flatten())


@pytest.mark.model
def test_projected_keys_and_values_are_those_a_full_layer_stores(quantized):
    """`project_kv` (early exit's propagation; int4: one native call for all the skipped layers)
    stores for each layer exactly the keys and values that running that layer on the same hidden
    state stores."""
    model = quantized
    ids = long_ids(model, 300)
    projected, full = model.new_cache(), model.new_cache()
    for cache in (projected, full):
        model.forward(torch.tensor(ids[:290]), cache)
    ctx = model.context(torch.tensor([290]))
    with torch.inference_mode():
        h = model.embed(torch.tensor([ids[290]]), ctx)
        h = model.run_layers(0, h, ctx, projected, 20)
        model.run_layers(0, model.embed(torch.tensor([ids[290]]), ctx), ctx, full, 20)
        model.project_kv(range(20, model.num_layers), h, ctx, projected)
        for i in range(20, model.num_layers):
            model.run_layer(i, h, ctx, full)  # each layer on the same input, its output left unused
    assert projected.lengths == full.lengths == [291] * model.num_layers
    for i in range(model.num_layers):
        assert torch.equal(projected.keys_by_feature(i, 0, 291), full.keys_by_feature(i, 0, 291)), i
        assert torch.equal(projected.values[i][..., :291, :], full.values[i][..., :291, :]), i
