"""A KV cache with one independent length per layer.

Early exit leaves deeper layers behind shallower ones, speculative decoding rolls layers back
past rejected tokens, and the server keeps caches of earlier prompts: all three need per-layer
lengths that can be moved, which Hugging Face's caches do not offer. The class is duck-typed to
what the Hugging Face attention modules call (`update(keys, values, layer_idx, kwargs=...)`).

Keys are stored transposed, (batch, heads, dim, capacity): attention multiplies the query by
the first `length` columns, a plain strided matrix for the CPU's bfloat16 GEMM. Stored the
usual way, that product reads keys transposed and strided at once, which takes a slow path
(SmolLM2, 500 keys: 100 us against 45 us per layer; the same bits). `layer_keys` gives the
usual (batch, heads, length, dim) view.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, capacity: int = 256):
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # (batch, heads, dim, capacity)
        self.values: list[torch.Tensor | None] = [None] * num_layers  # (batch, heads, capacity, dim)
        self.lengths = [0] * num_layers
        self._capacity = capacity
        # position ranges [a, b) not computed yet although later positions are: chunks of an
        # earlier prompt placed past them (serve/chunk_reuse.py); prefill runs them first
        self.holes: list[tuple[int, int]] = []
        # per position, how many times its keys and values were copied to a new position
        # (chunk reuse); positions past the list's end were computed where they are
        self.copies: list[int] = []

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, kwargs=None, **_):
        """Append keys/values (batch, heads, new, dim) at the layer's length; return all of them."""
        start = self.lengths[layer_idx]
        end = start + keys.shape[-2]
        buf_k = self.keys[layer_idx]
        if buf_k is None or buf_k.shape[-1] < end or buf_k.dtype != keys.dtype:
            self.grow(layer_idx, end, keys.shape[:-2] + values.shape[-1:], keys.dtype, keys.device,
                      key_dim=keys.shape[-1])
        self.keys[layer_idx][..., start:end] = keys.transpose(-1, -2)
        self.values[layer_idx][..., start:end, :] = values
        self.lengths[layer_idx] = end
        return self.layer_keys(layer_idx), self.values[layer_idx][..., :end, :]

    def layer_keys(self, layer_idx: int) -> torch.Tensor:
        """The layer's keys as (batch, heads, length, dim), a view."""
        return self.keys[layer_idx][..., : self.lengths[layer_idx]].transpose(-1, -2)

    def capacity(self, layer_idx: int) -> int:
        buf = self.keys[layer_idx]
        return 0 if buf is None else buf.shape[-1]

    def grow(self, layer_idx: int, end: int, shape: tuple, dtype: torch.dtype, device, key_dim: int | None = None,
             exact: bool = False):
        """Give a layer buffers for at least `end` positions, keeping its first `lengths[layer]`.
        `shape` = (batch, heads, value dim); keys have `key_dim` (default the value dim). The
        first buffer reserves `capacity` positions beyond `end`, later ones double, so a decode
        loop allocates rarely; `exact` gives exactly `end` positions. New positions hold zeros."""
        buf_k = self.keys[layer_idx]
        start = self.lengths[layer_idx]
        old = self.capacity(layer_idx)
        capacity = end if exact else max(end + self._capacity if buf_k is None else end, 2 * old)
        *lead, dim = shape
        new_k = torch.zeros(*lead, key_dim or dim, capacity, dtype=dtype, device=device)
        new_v = torch.zeros(*lead, capacity, dim, dtype=dtype, device=device)
        if buf_k is not None and start:
            new_k[..., :start] = buf_k[..., :start]
            new_v[..., :start, :] = self.values[layer_idx][..., :start, :]
        self.keys[layer_idx], self.values[layer_idx] = new_k, new_v

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
                self.keys[i][..., target] = self.keys[i][..., source]
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
                size = max(n, room)
                other.keys[i] = keys.new_empty(*keys.shape[:-1], size)
                other.values[i] = values.new_empty(*values.shape[:-2], size, values.shape[-1])
                other.keys[i][..., :n] = keys[..., :n]
                other.values[i][..., :n, :] = values[..., :n, :]
                other.keys[i][..., n:].zero_()  # positions past the length hold zeros, as `grow` leaves them
                other.values[i][..., n:, :].zero_()
            other.lengths[i] = n
        other.copies = self.copies[:length] if length is not None else list(self.copies)
        return other

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
