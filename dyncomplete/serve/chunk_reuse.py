"""Chunks of a cached prompt reused at new positions (llama.cpp's `--cache-reuse`, extended).

A fill-in-the-middle prompt is prefix, suffix, middle. When the user types, the prefix grows, and
every token of the suffix after it moves: a common-prefix cache then prefills the whole suffix
again at every pause. Here each run of at least `min_tokens` tokens that the new prompt shares
with the cached one, in the same order, is copied from the cache, its keys rotated by the
distance it moved (rotary embeddings make a key at position p + d the key at p rotated by d),
and only the tokens between such runs are prefilled. llama.cpp stops reusing at the first
token it has not cached; here a run may follow new tokens, which is where the suffix is.

A reused chunk keeps what it attended to when it was first computed, so a completion can differ
from a full prefill of the same prompt; the server's `--cache-reuse 0` turns it off. Copied again
and again, a chunk drifts further from what a prefill would give (it attended to text that has
since changed, and each rotation rounds its keys), so a position copied `limit` times is
prefilled again (`split_stale`), everywhere or only near the cursor.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

import torch

from ..models import KVCache, native
from ..models.kv_cache import copy_key_range, key_buffer, whole_blocks
from ..models.native import bindings
from ..models.rotary import rotate_keys, shift_angles


BLOCK = 64  # tokens compared at once (in C) before the last block is compared one by one


def common_prefix_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens two prompts share."""
    a, b = tuple(a), tuple(b)  # a tuple's slice never equals a list's
    n = min(len(a), len(b))
    i = 0
    while i + BLOCK <= n and a[i:i + BLOCK] == b[i:i + BLOCK]:
        i += BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Chunk:
    start: int  # new positions start .. end - 1 take the cached positions source .. source + (end - start) - 1
    end: int
    source: int


class Runs:
    """A prompt's runs of `min_tokens` tokens, each by its hash. A cached prompt's are built once
    and serve every later plan against it; a new prompt's once for all the prompts it is planned
    against."""

    def __init__(self, tokens, min_tokens: int):
        self.tokens, self.min_tokens = tuple(tokens), min_tokens
        self.hashes = [hash(self.tokens[k:k + min_tokens]) for k in range(len(self.tokens) - min_tokens + 1)]

    @cached_property
    def starts(self) -> dict[int, list[int]]:
        """Where the runs of each hash start, in order."""
        starts: dict[int, list[int]] = {}
        for k, h in enumerate(self.hashes):
            starts.setdefault(h, []).append(k)
        return starts


def plan_chunks(cached: Runs, new: Runs) -> list[Chunk]:
    """The runs of `new`'s tokens to copy from `cached`'s, in order, never overlapping in either
    prompt (both Runs of one length).

    The common prefix comes first (whatever its length); after it, at each position the longest
    run of at least `min_tokens` tokens that starts in `cached` past the last run used."""
    if cached.min_tokens != new.min_tokens:
        raise ValueError(f"runs of {cached.min_tokens} and {new.min_tokens} tokens cannot be matched")
    old, ids, m = cached.tokens, new.tokens, new.min_tokens
    chunks = []
    n = common_prefix_length(old, ids)
    if n:
        chunks.append(Chunk(0, n, 0))
    # where a run of `cached` may start: another editor's prompt has few, so the walk below
    # visits those positions, not every one
    starts = cached.starts
    hits = [i for i, h in enumerate(new.hashes) if h in starts]
    at, floor = bisect.bisect_left(hits, n), n
    while at < len(hits):
        i, best, source = hits[at], 0, -1
        for k in starts[new.hashes[i]]:
            if k < floor or old[k:k + m] != ids[i:i + m]:  # before the last run used, or another run of that hash
                continue
            length = m + common_prefix_length(ids[i + m:], old[k + m:])
            if length > best:
                best, source = length, k
        if best:
            chunks.append(Chunk(i, i + best, source))
            floor = source + best
            at = bisect.bisect_left(hits, i + best, at)
        else:
            at += 1
    return chunks


def copied(copies: list[int], position: int) -> int:
    """How often `position` was copied, by a cache's `copies` (positions past its end: never)."""
    return copies[position] if position < len(copies) else 0


def split_stale(chunks: list[Chunk], copies: list[int], limit: int, min_tokens: int,
                guarded: tuple[int, int] | None = None) -> list[Chunk]:
    """`chunks` without the cached positions copied `limit` times already (`copies`), each moved
    chunk cut there into the runs of at least `min_tokens` tokens left. A chunk that stays in
    place (the common prefix) is kept whole: it attends to the same text as before. `guarded`
    (start, end): the limit holds for those new positions only (None: for all)."""
    lo, hi = guarded if guarded is not None else (0, float("inf"))
    out = []
    for c in chunks:
        if c.start == c.source:
            out.append(c)
            continue
        shift = c.source - c.start
        stale = [p for p in range(max(c.start, lo), min(c.end, hi)) if copied(copies, p + shift) >= limit]
        edges = [c.start - 1, *stale, c.end]  # the runs between stale positions
        out += [Chunk(a + 1, b, a + 1 + shift) for a, b in zip(edges, edges[1:]) if b - a - 1 >= min_tokens]
    return out


def assemble(cached: KVCache, chunks: list[Chunk], length: int, inv_freq: torch.Tensor, room: int) -> KVCache:
    """A new cache holding `chunks` of `cached` at their new positions, keys rotated, and the gaps
    between them as `holes` for prefill to run; positions from the last chunk's end on are left
    to prefill as usual. `room`: the capacity the buffers get (at least `length`). The new
    cache's `copies` count one more copy for each moved position."""
    out = KVCache(cached.num_layers)
    out.copies = [0] * length
    for c in chunks:
        n, moved = c.end - c.start, int(c.start != c.source)
        counts = cached.copies[c.source:c.source + n]  # positions past its end were never copied
        out.copies[c.start:c.end] = [k + moved for k in counts] + [moved] * (n - len(counts))
    room = whole_blocks(room)  # keys come in whole blocks, and values take as many positions
    for layer in range(cached.num_layers):
        keys, values = cached.keys[layer], cached.values[layer]
        out.keys[layer] = key_buffer(keys.shape[:2], keys.shape[3], room, keys.dtype, keys.device)
        out.values[layer] = values.new_zeros(*values.shape[:-2], room, values.shape[-1])
    # in C where the engine's kernels are loaded (int4, int8): a request never waits for a compiler
    in_c = cached.keys[0].dtype == torch.bfloat16 and cached.keys[0].device.type == "cpu" and native.loaded()
    for c in chunks:
        n, delta = c.end - c.start, c.start - c.source
        for layer in range(cached.num_layers):
            out.values[layer][..., c.start:c.end, :] = cached.values[layer][..., c.source:c.source + n, :]
        if not delta:  # in place (the common prefix): the keys as they are, whole blocks at once
            for layer in range(cached.num_layers):
                copy_key_range(cached.keys[layer], out.keys[layer], c.start, c.end)
        elif in_c:  # every layer in one call: PyTorch's dozen passes over the keys took most of a lookup
            bindings.rotate_keys(cached.keys, c.source, out.keys, c.start, n, *shift_angles(delta, inv_freq))
        else:
            for layer in range(cached.num_layers):
                block = cached.keys_by_feature(layer, c.source, c.source + n)
                out.put_keys(layer, c.start, rotate_keys(block, delta, inv_freq))
    end = chunks[-1].end if chunks else 0
    out.lengths = [min(end, length)] * cached.num_layers
    edges = [0] + [e for c in chunks for e in (c.start, c.end)]
    out.holes = [(a, b) for a, b in zip(edges[::2], edges[1::2]) if a < b]
    return out
