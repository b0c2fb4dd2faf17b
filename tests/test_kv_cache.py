"""The KV cache's blocked keys: what is written at any positions reads back the same, across block
edges, through growth, copies and moves, and positions past a copy's length read as zeros."""

import torch

from dyncomplete.models import KVCache
from dyncomplete.models.kv_cache import KEY_BLOCK, copy_key_range


def filled(n: int, heads: int = 2, dim: int = 8) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
    """A one-layer cache of n positions written in three uneven parts; its keys and values."""
    torch.manual_seed(n)
    keys, values = torch.randn(1, heads, n, dim), torch.randn(1, heads, n, dim)
    cache = KVCache(1, capacity=5)  # room past the first part not a whole block: grown twice
    for a, b in ((0, 7), (7, 7 + KEY_BLOCK + 3), (7 + KEY_BLOCK + 3, n)):
        cache.update(keys[:, :, a:b], values[:, :, a:b], 0)
    return cache, keys, values


def test_keys_read_back_as_written_across_blocks_and_growth():
    n = 3 * KEY_BLOCK + 5
    cache, keys, values = filled(n)
    assert cache.capacity(0) % KEY_BLOCK == 0 and cache.capacity(0) >= n
    assert torch.equal(cache.layer_keys(0), keys)
    assert torch.equal(cache.keys_by_feature(0, 30, 70), keys[:, :, 30:70].transpose(-1, -2))
    returned_keys, returned_values = cache.update(keys[:, :, :1], values[:, :, :1], 0)
    assert torch.equal(returned_keys[:, :, :n], keys) and torch.equal(returned_keys[:, :, n], keys[:, :, 0])


def test_a_copy_keeps_positions_before_its_length_and_zeros_after():
    n = 2 * KEY_BLOCK + 9
    cache, keys, _ = filled(n)
    part = cache.copy(length=KEY_BLOCK + 3, room=100)
    assert part.capacity(0) >= 100 and part.lengths == [KEY_BLOCK + 3]
    assert torch.equal(part.layer_keys(0), keys[:, :, : KEY_BLOCK + 3])
    assert not part.keys_by_feature(0, KEY_BLOCK + 3, part.capacity(0)).any()


def test_move_copies_one_slot_into_another_block():
    n = 2 * KEY_BLOCK + 1
    cache, keys, values = filled(n)
    cache.move(KEY_BLOCK * 2, 3)
    expected = keys.clone()
    expected[:, :, 3] = keys[:, :, KEY_BLOCK * 2]
    assert torch.equal(cache.layer_keys(0), expected)
    assert torch.equal(cache.values[0][:, :, 3], values[:, :, KEY_BLOCK * 2])


def test_a_key_range_copies_those_positions_and_leaves_the_others():
    n = 4 * KEY_BLOCK
    source, keys, _ = filled(n)
    for start, end in ((0, n), (3, 9), (5, KEY_BLOCK), (KEY_BLOCK, 3 * KEY_BLOCK), (10, 2 * KEY_BLOCK + 7),
                       (KEY_BLOCK - 1, KEY_BLOCK + 1), (7, 7)):
        target = KVCache(1)
        target.update(torch.zeros(1, 2, n, 8), torch.zeros(1, 2, n, 8), 0)
        copy_key_range(source.keys[0], target.keys[0], start, end)
        expected = torch.zeros_like(keys)
        expected[:, :, start:end] = keys[:, :, start:end]
        assert torch.equal(target.layer_keys(0), expected), (start, end)
