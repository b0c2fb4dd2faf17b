"""A KV cache with one independent length per layer.

Early exit leaves deeper layers behind shallower ones, speculative decoding rolls layers back
past rejected tokens, and the server keeps caches of earlier prompts: all three need per-layer
lengths that can be moved, which Hugging Face's caches do not offer. The class is duck-typed to
what the Hugging Face attention modules call (`update(keys, values, layer_idx, kwargs=...)`).

Keys are stored in blocks of KEY_BLOCK positions, each block feature by feature: (batch, heads,
capacity / KEY_BLOCK, dim, KEY_BLOCK). decode.c's attention scores a block's keys from one
contiguous stretch of memory; stored (dim, capacity), the same keys lay in dim rows of the cache,
which memory served more slowly (`docs/results.md`). PyTorch's attention takes the keys as
(batch, heads, dim, n) (`keys_by_feature`, a copy) or the usual (batch, heads, length, dim)
(`layer_keys`).
"""

from __future__ import annotations

import torch

KEY_BLOCK = 32  # positions of a block of keys (decode.c's KEY_BLOCK)


def whole_blocks(positions: int) -> int:
    """`positions` rounded up to a multiple of KEY_BLOCK: the capacity a cache buffer gets."""
    return -(-positions // KEY_BLOCK) * KEY_BLOCK


def key_buffer(lead: tuple, dim: int, capacity: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Zeroed keys of `capacity` positions (rounded up to whole blocks): (*lead, blocks, dim, KEY_BLOCK)."""
    return torch.zeros(*lead, whole_blocks(capacity) // KEY_BLOCK, dim, KEY_BLOCK, dtype=dtype, device=device)


def copy_keys(source: torch.Tensor, target: torch.Tensor, n: int) -> None:
    """Positions < n of `source` into `target` (blocked keys), the rest of n's block zeroed."""
    blocks = whole_blocks(n) // KEY_BLOCK
    target[:, :, :blocks] = source[:, :, :blocks]
    if n % KEY_BLOCK:
        target[:, :, n // KEY_BLOCK, :, n % KEY_BLOCK :] = 0


def copy_key_range(source: torch.Tensor, target: torch.Tensor, start: int, end: int) -> None:
    """Positions start..end - 1 of `source` into the same positions of `target` (blocked keys):
    the whole blocks between in one copy, the partial ones at either end position by position."""
    first, last = -(-start // KEY_BLOCK) * KEY_BLOCK, end // KEY_BLOCK * KEY_BLOCK  # the whole blocks' span
    if first > last:  # within one block
        _copy_in_block(source, target, start, end)
        return
    target[:, :, first // KEY_BLOCK : last // KEY_BLOCK] = source[:, :, first // KEY_BLOCK : last // KEY_BLOCK]
    _copy_in_block(source, target, start, first)
    _copy_in_block(source, target, last, end)


def _copy_in_block(source: torch.Tensor, target: torch.Tensor, start: int, end: int) -> None:
    """Positions start..end - 1, all in one block (none where end <= start)."""
    if start < end:
        block, a = divmod(start, KEY_BLOCK)
        target[:, :, block, :, a : a + end - start] = source[:, :, block, :, a : a + end - start]


class KVCache:
    def __init__(self, num_layers: int, capacity: int = 256):
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # (batch, heads, blocks, dim, KEY_BLOCK)
        self.values: list[torch.Tensor | None] = [None] * num_layers  # (batch, heads, capacity, dim)
        self.lengths = [0] * num_layers
        self._capacity = capacity
        # position ranges [a, b) not computed yet although later positions are: chunks of an
        # earlier prompt placed past them (serve/chunk_reuse.py); prefill runs them first
        self.holes: list[tuple[int, int]] = []
        # per position, how many times its keys and values were copied to a new position
        # (chunk reuse); positions past the list's end were computed where they are
        self.copies: list[int] = []
        self.pointers = None  # decode.c's arrays of these buffers, set by `bindings.CachePointers.of`

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, kwargs=None, **_):
        """Append keys/values (batch, heads, new, dim) at the layer's length; return all of them."""
        start = self.lengths[layer_idx]
        end = start + keys.shape[-2]
        buf_k = self.keys[layer_idx]
        if buf_k is None or self.capacity(layer_idx) < end or buf_k.dtype != keys.dtype:
            self.grow(layer_idx, end, keys.shape[:-2] + values.shape[-1:], keys.dtype, keys.device,
                      key_dim=keys.shape[-1])
        self.put_keys(layer_idx, start, keys.transpose(-1, -2))
        self.values[layer_idx][..., start:end, :] = values
        self.lengths[layer_idx] = end
        return self.layer_keys(layer_idx), self.values[layer_idx][..., :end, :]

    def layer_keys(self, layer_idx: int) -> torch.Tensor:
        """The layer's keys as (batch, heads, length, dim)."""
        return self.keys_by_feature(layer_idx, 0, self.lengths[layer_idx]).transpose(-1, -2)

    def keys_by_feature(self, layer_idx: int, start: int, end: int) -> torch.Tensor:
        """The keys of positions start..end - 1 as (batch, heads, dim, end - start), to read (a copy,
        or a view where one block holds them: `put_keys` writes)."""
        buf = self.keys[layer_idx]
        first, last = start // KEY_BLOCK, -(-end // KEY_BLOCK)
        whole = buf[:, :, first:last].permute(0, 1, 3, 2, 4).reshape(*buf.shape[:2], buf.shape[3], -1)
        return whole[..., start - first * KEY_BLOCK : end - first * KEY_BLOCK]

    def put_keys(self, layer_idx: int, start: int, keys: torch.Tensor) -> None:
        """Write keys (batch, heads, dim, n) at positions start..start + n - 1."""
        buf, end = self.keys[layer_idx], start + keys.shape[-1]
        for block in range(start // KEY_BLOCK, -(-end // KEY_BLOCK)):
            a, b = max(start, block * KEY_BLOCK), min(end, (block + 1) * KEY_BLOCK)
            buf[:, :, block, :, a - block * KEY_BLOCK : b - block * KEY_BLOCK] = keys[..., a - start : b - start]

    def capacity(self, layer_idx: int) -> int:
        buf = self.keys[layer_idx]
        return 0 if buf is None else buf.shape[2] * KEY_BLOCK

    def grow(self, layer_idx: int, end: int, shape: tuple, dtype: torch.dtype, device, key_dim: int | None = None,
             exact: bool = False):
        """Give a layer buffers for at least `end` positions, keeping its first `lengths[layer]`.
        `shape` = (batch, heads, value dim); keys have `key_dim` (default the value dim). The
        first buffer reserves `capacity` positions beyond `end`, later ones double, so a decode
        loop allocates rarely; `exact` gives `end` positions rounded up to whole key blocks. New
        positions hold zeros."""
        buf_k = self.keys[layer_idx]
        start = self.lengths[layer_idx]
        old = self.capacity(layer_idx)
        capacity = end if exact else max(end + self._capacity if buf_k is None else end, 2 * old)
        capacity = whole_blocks(capacity)
        *lead, dim = shape
        new_k = key_buffer(tuple(lead), key_dim or dim, capacity, dtype, device)
        new_v = torch.zeros(*lead, capacity, dim, dtype=dtype, device=device)
        if buf_k is not None and start:
            copy_keys(buf_k, new_k, start)
            new_v[..., :start, :] = self.values[layer_idx][..., :start, :]
        self.keys[layer_idx], self.values[layer_idx] = new_k, new_v
        self.pointers = None  # they pointed into the old buffers, which they kept alive

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def crop(self, length: int, layers: range | None = None) -> None:
        """Forget everything at positions >= length (in the given layers, default all)."""
        for i in layers if layers is not None else range(self.num_layers):
            self.lengths[i] = min(self.lengths[i], length)

    def move(self, source: int, target: int) -> None:
        """Copy slot `source`'s keys and values to slot `target` in every layer that holds both
        (a token tree's accepted rows move to consecutive slots)."""
        for i, n in enumerate(self.lengths):
            if self.keys[i] is not None and max(source, target) < n:
                keys = self.keys[i]
                keys[:, :, target // KEY_BLOCK, :, target % KEY_BLOCK] = keys[:, :, source // KEY_BLOCK, :, source % KEY_BLOCK]
                self.values[i][..., target, :] = self.values[i][..., source, :]

    def copy(self, length: int | None = None, room: int = 0) -> "KVCache":
        """An independent cache with the same contents, or only positions < `length`, in buffers
        trimmed to what is copied, or of `room` positions where that is more (the prompt a
        copy is for: its prefill then writes into them without growing them again)."""
        other = KVCache(self.num_layers, self._capacity)
        for i, n in enumerate(self.lengths):
            n = n if length is None else min(n, length)
            if self.keys[i] is not None and n:
                keys, values = self.keys[i], self.values[i]
                size = whole_blocks(max(n, room))
                other.keys[i] = key_buffer(keys.shape[:2], keys.shape[3], size, keys.dtype, keys.device)
                copy_keys(keys, other.keys[i], n)  # positions past the length hold zeros, as `grow` leaves them
                other.values[i] = values.new_zeros(*values.shape[:-2], size, values.shape[-1])
                other.values[i][..., :n, :] = values[..., :n, :]
            other.lengths[i] = n
        other.copies = self.copies[:length] if length is not None else list(self.copies)
        return other

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
