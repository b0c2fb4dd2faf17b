"""Prefix cache: reuse gives the same tokens as a fresh prefill, memory stays bounded, and the
stable prompt window keeps a growing prefix's start fixed so the cache keeps hitting."""

import inspect
import json.decoder

import pytest
import torch
from helpers import ids_of

from dyncomplete.engine import GenerationParams
from dyncomplete.engine.method import PREFILL_CHUNK
from dyncomplete.methods.baseline import Baseline
from dyncomplete.models import KVCache
from dyncomplete.models.rotary import shift_frequencies
from dyncomplete.serve.prefix_cache import PrefixCache
from dyncomplete.engine.window import stable_prefix

pytestmark = pytest.mark.model

# real code, about 12k characters, that does not change as this project does (the window tests'
# counts depend on where its lines fall)
SOURCE = inspect.getsource(json.decoder)


def test_reuse_is_token_identical_to_a_fresh_prefill(smollm):
    cache = PrefixCache(max_bytes=256 * 2**20)
    params = GenerationParams(max_new_tokens=4)
    # A typing session: each prompt extends or edits the previous one.
    cuts = [300, 330, 360, 340]
    reused = []
    for n in cuts:
        ids = ids_of(smollm, SOURCE[:n])
        fresh = Baseline().generate(smollm, ids, params)
        kv, shared = cache.lookup(ids)
        kv = kv if kv is not None else smollm.new_cache()
        cached = Baseline().generate(smollm, ids, params, cache=kv)
        assert cache.store(ids, kv)
        assert cached.token_ids == fresh.token_ids, n
        assert cached.stats.cached_prompt_tokens == min(shared, len(ids) - 1)
        reused.append(cached.stats.cached_prompt_tokens)
    assert reused[0] == 0 and all(r > 50 for r in reused[1:]), reused
    assert cache.counters.hits == len(cuts) - 1


def test_a_cancelled_prefill_stops_between_chunks_and_its_start_is_reused(smollm):
    """A request cancelled (superseded) during its prompt stops after the chunk that runs; the
    cache then holds that start, which the next request reuses for baseline's tokens."""
    ids = ids_of(smollm, SOURCE[:2000])
    params = GenerationParams(max_new_tokens=4)
    checks = []

    def cancelled() -> bool:
        checks.append(1)
        return len(checks) > 3  # three chunks run

    kv = smollm.new_cache()
    stopped = Baseline().generate(smollm, ids, params, cache=kv, cancelled=cancelled)
    done = 3 * PREFILL_CHUNK
    assert len(ids) > done + PREFILL_CHUNK
    assert stopped.stats.stopped_by == "cancelled" and stopped.token_ids == [] and len(checks) == 4
    assert stopped.stats.prompt_tokens == done and kv.lengths == [done] * smollm.num_layers
    cache = PrefixCache(max_bytes=256 * 2**20)
    assert cache.store(ids[:done], kv)
    kv, shared = cache.lookup(ids)
    assert shared == done
    assert Baseline().generate(smollm, ids, params, cache=kv).token_ids == Baseline().generate(smollm, ids, params).token_ids


def test_memory_bound_eviction_and_subsumed_entries(smollm):
    def filled(n):
        kv = smollm.new_cache()
        smollm.forward(torch.tensor(ids_of(smollm, SOURCE)[:n]), kv)
        return kv

    ids = ids_of(smollm, SOURCE)
    one = filled(40).copy().nbytes()
    cache = PrefixCache(max_bytes=int(2.5 * one))
    assert cache.store(ids[:20], filled(40))  # keeps only the prompt's 20 positions
    assert cache.store(ids[:40], filled(40))  # extends the first entry, which is dropped
    assert len(cache) == 1 and cache.nbytes == one
    other = [t + 1 for t in ids[:40]]
    assert cache.store(other, filled(40)) and cache.store([t + 2 for t in ids[:40]], filled(40))
    assert cache.nbytes <= cache.max_bytes and cache.counters.evictions == 1
    assert cache.lookup(ids[:40]) == (None, 0)  # the least recently used entry went first
    kv, n = cache.lookup(other[:30] + [0])
    assert n == 30 and kv.lengths == [30] * smollm.num_layers
    assert not cache.store(ids[:50], filled(40))  # the cache does not hold all 50 positions
    with pytest.raises(ValueError):
        PrefixCache(-1)
    assert isinstance(kv, KVCache)


def test_entries_of_another_prompt_depth_are_never_reused(smollm):
    """An early exit's shallow prompt (`prompt=L`) leaves projected keys above L: a lookup reads
    only entries of its own depth, and the same prompt may be kept at both."""
    ids = ids_of(smollm, SOURCE)[:40]
    kv = smollm.new_cache()
    smollm.forward(torch.tensor(ids), kv)
    cache = PrefixCache(max_bytes=256 * 2**20, min_chunk=8, inv_freq=shift_frequencies(smollm))
    assert cache.store(ids, kv.copy(), depth=20)
    assert cache.lookup(ids + [1]) == (None, 0)
    assert cache.lookup(ids[5:] + [1]) == (None, 0)  # nor its chunks at new positions
    assert cache.lookup(ids + [1], depth=20)[1] == 40
    assert cache.store(ids, kv.copy()) and len(cache) == 2
    assert cache.lookup(ids + [1])[1] == 40


def window_starts(smollm, prefixes, budget):
    """Where each prefix's kept text starts, as (index of the prefix's first character in the
    whole text, token count kept); `prefixes` are (offset in the whole text, text)."""
    kept = []
    for offset, text in prefixes:
        window, cut = stable_prefix(smollm.tokenizer, text, budget)
        assert cut and text.endswith(window)
        kept.append((offset + len(text) - len(window), len(ids_of(smollm, window))))
    return kept


@pytest.mark.parametrize("pattern", ["typing", "sliding"])
def test_stable_window_keeps_the_start(smollm, pattern):
    """Typing at the end of a file, and moving down it with llama.vim's window (a fixed number of
    lines before the cursor): the prompt's start moves at fewer than a third of the steps, and
    it keeps between half the budget and the budget."""
    budget = 256
    if pattern == "typing":  # 400 characters typed in steps of 10
        prefixes = [(0, SOURCE[:end]) for end in range(4000, 4400, 10)]
    else:  # 40 steps of 2 lines, the 100 lines before the cursor sent
        lines = SOURCE.splitlines(keepends=True)
        prefixes = [(len("".join(lines[: cursor - 100])), "".join(lines[cursor - 100 : cursor]))
                    for cursor in range(100, 180, 2)]
    kept = window_starts(smollm, prefixes, budget)
    moves = sum(a[0] != b[0] for a, b in zip(kept, kept[1:]))
    assert moves < len(kept) / 3, kept
    assert all(budget // 2 - 1 <= n <= budget for _, n in kept), kept
    short = SOURCE[:300]
    assert stable_prefix(smollm.tokenizer, short, budget) == (short, False)
