"""Chunk reuse: which runs of a cached prompt are copied, keys moved by rotation, and a prefill
around them that runs the gaps in order."""

import inspect

import pytest
import torch

from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline
from dyncomplete.models import KVCache, layered, native
from dyncomplete.models.kv_cache import KEY_BLOCK, key_buffer
from dyncomplete.models.native import bindings
from dyncomplete.models.rotary import rotate_keys, shift_angles, shift_frequencies
from dyncomplete.serve.chunk_reuse import Chunk, Runs, plan_chunks, split_stale
from dyncomplete.serve.prefix_cache import RECENT_PROMPTS, PrefixCache


def test_plan_copies_the_prefix_and_the_moved_suffix_but_not_the_new_tokens():
    old = tuple(range(100))
    new = list(range(40)) + [900, 901, 902] + list(range(40, 100))
    assert plan_chunks(Runs(old, 8), Runs(new, 8)) == [Chunk(0, 40, 0), Chunk(43, 103, 40)]


def test_plan_drops_a_window_start_and_ignores_runs_shorter_than_the_minimum():
    old = tuple(range(100))
    new = [500] + list(range(10, 60)) + list(range(200, 205)) + list(range(60, 64))
    assert plan_chunks(Runs(old, 8), Runs(new, 8)) == [Chunk(1, 51, 10)]  # 60..63 is 4 tokens: under the minimum


def test_a_run_that_only_shares_a_hash_is_not_copied():
    old, new = Runs(tuple(range(100)), 8), Runs([500 + k for k in range(8)] + list(range(50, 60)), 8)
    new.hashes[0] = old.hashes[20]  # as if two different runs hashed alike
    assert plan_chunks(old, new) == [Chunk(8, 18, 50)]
    with pytest.raises(ValueError, match="runs of 8 and 4 tokens"):
        plan_chunks(old, Runs(new.tokens, 4))


def test_plan_keeps_cached_order():
    old = tuple(range(50))
    new = list(range(30, 50)) + list(range(0, 30))  # swapped halves: only the first run can follow order
    assert plan_chunks(Runs(old, 8), Runs(new, 8)) == [Chunk(0, 20, 30)]


def test_positions_copied_to_the_limit_are_prefilled_again_and_the_common_prefix_stays():
    chunks = [Chunk(0, 10, 0), Chunk(13, 60, 10)]
    copies = [5] * 10 + [0] * 10 + [2] * 5 + [1] * 40  # the prefix's count does not matter: it never moves
    assert split_stale(chunks, copies, 2, 8) == [Chunk(0, 10, 0), Chunk(13, 23, 10), Chunk(28, 60, 25)]
    assert split_stale(chunks, copies, 1, 8) == [Chunk(0, 10, 0), Chunk(13, 23, 10)]
    assert split_stale(chunks, [0] * 16 + [3] + [0] * 48, 3, 8) == [Chunk(0, 10, 0), Chunk(20, 60, 17)]  # 6 left: dropped


def test_near_the_cursor_only_the_positions_around_it_are_prefilled_again():
    chunks = [Chunk(0, 10, 0), Chunk(13, 60, 10)]
    copies = [0] * 10 + [2] * 50  # the whole moved chunk reached the limit
    assert split_stale(chunks, copies, 2, 8) == [Chunk(0, 10, 0)]
    assert split_stale(chunks, copies, 2, 8, guarded=(20, 30)) == [Chunk(0, 10, 0), Chunk(30, 60, 27)]  # 13..19: 7, under the minimum
    assert split_stale(chunks, copies, 2, 8, guarded=(0, 13)) == chunks  # no moved position near the cursor


def zero_cache(n: int) -> KVCache:
    """A one-layer cache of n positions (what the prefix cache's bookkeeping needs, no model)."""
    kv = KVCache(1)
    kv.update(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4), 0)
    return kv


def test_the_cache_keeps_the_limit_near_the_cursor_it_is_given():
    old, new = list(range(100)), list(range(40)) + [900, 901, 902] + list(range(40, 100))
    stored = zero_cache(100)
    stored.copies = [0] * 40 + [2] * 60  # the part after the insertion reached the limit
    cache = PrefixCache(2**20, min_chunk=8, inv_freq=torch.ones(2), copy_limit=2, near=10)
    assert cache.store(old, stored)
    kv, reused = cache.lookup(new)  # no cursor: the limit everywhere
    assert reused == 40 and kv.holes == []
    kv, reused = cache.lookup(new, cursor=80)  # new positions 70..89 prefilled again, the rest copied
    assert reused == 40 + 27 + 13 and kv.holes == [(40, 43), (70, 90)]
    with pytest.raises(ValueError, match="cursor"):
        PrefixCache(2**20, near=-1)


def test_rotating_a_key_by_d_gives_the_key_at_the_position_d_further():
    torch.manual_seed(0)
    dim, n = 64, 5
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    raw = torch.randn(2, dim, n)

    def rope(x, positions):
        angle = torch.tensor(positions, dtype=torch.float32)[None, :] * inv_freq[:, None]  # (dim/2, n)
        x1, x2 = x[:, : dim // 2], x[:, dim // 2 :]
        return torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), dim=1)

    at_10 = rope(raw, list(range(10, 15)))
    moved = rotate_keys(at_10, 37, inv_freq)
    assert torch.allclose(moved, rope(raw, list(range(47, 52))), atol=1e-4)
    assert torch.allclose(rotate_keys(moved, -37, inv_freq), at_10, atol=1e-4)


def test_native_key_rotation_gives_the_bits_of_pytorchs_for_every_layer():
    if not native.available():
        pytest.skip("no C compiler here")
    torch.manual_seed(1)
    layers, heads, dim, n = 3, 2, 64, 37
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, dim, 2).float() / dim))
    src, dst = KVCache(layers), KVCache(layers)
    for i in range(layers):
        src.keys[i] = (torch.randn(1, heads, 256 // KEY_BLOCK, dim, KEY_BLOCK) * 4).to(torch.bfloat16)
        dst.keys[i] = key_buffer((1, heads), dim, 512, torch.bfloat16, "cpu")
    bindings.rotate_keys(src.keys, 100, dst.keys, 301, n, *shift_angles(201, inv_freq))
    for i in range(layers):
        out = dst.keys_by_feature(i, 0, 512)
        assert torch.equal(out[..., 301:301 + n], rotate_keys(src.keys_by_feature(i, 100, 100 + n), 201, inv_freq))
        assert not out[..., :301].any() and not out[..., 301 + n:].any()  # nothing written outside the chunk


@pytest.mark.model
def test_reused_chunks_give_layer_zero_keys_of_a_full_prefill_and_the_gaps_run(smollm_bf16):
    model = smollm_bf16
    source = inspect.getsource(layered)
    ids = model.tokenizer(source[:3000], add_special_tokens=False).input_ids
    inserted = model.tokenizer("\n# a line the user just typed\nvalue = compute(1, 2)\n", add_special_tokens=False).input_ids
    cut = len(ids) // 2
    new = ids[:cut] + inserted + ids[cut:]
    cache = PrefixCache(2**28, min_chunk=16, inv_freq=shift_frequencies(model))
    params = GenerationParams(max_new_tokens=4)
    old_kv = model.new_cache()
    Baseline().generate(model, ids, params, cache=old_kv)
    assert cache.store(ids, old_kv)

    kv, reused = cache.lookup(new)
    assert reused == len(new) - len(inserted) and kv.holes == [(cut, cut + len(inserted))]
    assert kv.copies == [0] * (cut + len(inserted)) + [1] * (len(ids) - cut)  # the moved chunk: one copy
    full = model.new_cache()
    model.forward(torch.tensor(new), full)
    moved = slice(cut + len(inserted), len(new))  # the chunk that moved by len(inserted)
    assert torch.equal(kv.values[0][..., moved, :], full.values[0][..., moved, :])
    rotated, fresh = kv.keys_by_feature(0, moved.start, moved.stop).float(), full.keys_by_feature(0, moved.start, moved.stop).float()
    unrotated = old_kv.keys_by_feature(0, cut, len(ids)).float()
    bound = fresh.abs().max() / 128  # bfloat16 keeps 8 bits: one rounding step at the largest key
    assert (rotated - fresh).abs().max() <= bound < (unrotated - fresh).abs().max() / 10

    result = Baseline().generate(model, new, params, cache=kv)
    assert result.stats.cached_prompt_tokens == len(new) - len(inserted) - 1  # the last token always runs
    gap = slice(cut, cut + len(inserted))
    alone = old_kv.copy(cut)  # the gap after the cached prefix, nothing after it
    model.forward(torch.tensor(inserted), alone)
    assert torch.equal(kv.keys_by_feature(5, gap.start, gap.stop), alone.keys_by_feature(5, gap.start, gap.stop))  # it attended to the prefix only
    assert len(result.token_ids) == 4


def test_an_editor_reuses_its_moved_suffix_however_many_prompts_came_since():
    """Four llama.vim editors send a request and a speculative one a pause each: by an editor's
    next pause, the other editors' prompts fill the most recent ones that chunk reuse plans
    against; its own last prompt, the one sharing the longest prefix, is planned against too."""
    mine = list(range(100))
    cache = PrefixCache(2**24, min_chunk=8, inv_freq=torch.ones(2))
    assert cache.store(mine, zero_cache(100))
    for other in range(RECENT_PROMPTS):
        assert cache.store([1000 * (other + 1) + t for t in range(100)], zero_cache(100))
    kv, reused = cache.lookup(mine[:40] + [900, 901, 902] + mine[40:])
    assert reused == 100 and kv.holes == [(40, 43)]


def test_a_start_that_a_stored_prompt_holds_is_not_stored_again():
    """A speculative request cancelled in its prefill leaves the start of a prompt that another
    entry already holds: storing it would only take one of the recent places that chunk reuse
    plans against from a whole prompt."""
    mine = list(range(100))
    cache = PrefixCache(2**24, min_chunk=8, inv_freq=torch.ones(2))
    assert cache.store(mine, zero_cache(100))
    assert not cache.store(mine[:40], zero_cache(40))
    assert cache.store(mine[:40] + [900], zero_cache(41))  # a start with text of its own is kept
    assert len(cache) == 2
    kv, reused = cache.lookup(mine[:60] + [901])
    assert reused == 60 and kv.lengths[0] == 60


@pytest.mark.model
def test_an_editor_reuses_its_own_moved_suffix_after_another_editors_prompt(smollm_bf16):
    """A server shared by two editors takes turns: the most recent prompt is the other editor's."""
    model = smollm_bf16
    source = inspect.getsource(layered)
    mine = model.tokenizer(source[:1500], add_special_tokens=False).input_ids
    theirs = model.tokenizer(source[-1500:], add_special_tokens=False).input_ids
    inserted = model.tokenizer("\nvalue = compute(1, 2)\n", add_special_tokens=False).input_ids
    cut = len(mine) // 2
    cache = PrefixCache(2**28, min_chunk=16, inv_freq=shift_frequencies(model))
    for ids in (mine, theirs):  # mine first, then the other editor's
        kv = model.new_cache()
        model.forward(torch.tensor(ids), kv)
        assert cache.store(ids, kv)
    kv, reused = cache.lookup(mine[:cut] + inserted + mine[cut:])
    assert reused == len(mine) and kv.holes == [(cut, cut + len(inserted))]
