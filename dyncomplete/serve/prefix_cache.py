"""Prefix cache: KV caches of recent prompts, reused through the longest common token prefix.

An editor sends nearly the same prompt at every pause in typing; reusing the KV of the part it
shares with an earlier prompt leaves only the new tokens to prefill. Entries hold the prompt's
positions only (generated tokens are dropped: a lossy method may have left approximate keys
there), and are kept apart by the prompt depth of the method that computed them
(`DecodingMethod.prompt_depth`, None for every layer: an early exit's `prompt=L` projects the
keys above L), so a reused cache gives exactly the output of a fresh prefill of that method.
Memory is bounded by bytes, evicting the least recently used entry; an entry whose prompt starts
a newer one is dropped, as the newer one serves every request the older one could.

With `min_chunk` (and the model's rotary frequencies), a lookup also reuses later runs of one of
the most recently used prompts, or of the one sharing the longest prefix, at new positions
(chunk_reuse.py), the one that gives the most: an approximation, off with 0. The longest prefix
is most often the same editor's last prompt, which four llama.vim editors (a request and a
speculative one each a pause) push out of the recent ones. A position copied `copy_limit` times
is prefilled again (0: no limit); with `near`, only within `near` positions of the request's
cursor. Moving down a file, every pause moves the whole suffix: a limit everywhere prefills all
of it again at once every few pauses (a shared server's slowest answers), near the cursor a few
lines at a time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice

from ..models import KVCache
from ..models.fast import SPAN
from .chunk_reuse import Runs, assemble, common_prefix_length, plan_chunks, split_stale

RECENT_PROMPTS = 8  # prompts chunk reuse plans against (each prompt's runs hashed once: a plan is a dict walk)


@dataclass
class CacheCounters:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evictions: int = 0


@dataclass
class _Entry:
    cache: KVCache  # exactly the prompt's positions
    runs: Runs | None  # the prompt's runs, which chunk reuse plans against (None: reuse off)


class PrefixCache:
    """LRU of ((prompt depth, prompt token ids) -> KVCache holding exactly those positions),
    bounded by bytes."""

    def __init__(self, max_bytes: int, min_chunk: int = 0, inv_freq=None, copy_limit: int = 0, near: int = 0):
        if max_bytes < 0:
            raise ValueError(f"prefix cache size must be >= 0 bytes, got {max_bytes}")
        if min_chunk < 0:
            raise ValueError(f"cache reuse needs chunks of >= 1 token (0: off), got {min_chunk}")
        if copy_limit < 0:
            raise ValueError(f"cache reuse copies a position at most N >= 1 times (0: no limit), got {copy_limit}")
        if near < 0:
            raise ValueError(f"the copy limit's reach around the cursor must be >= 0 positions (0: everywhere), got {near}")
        self.copy_limit = copy_limit
        self.near = near
        self.max_bytes = max_bytes
        self.min_chunk = min_chunk if inv_freq is not None else 0
        self.inv_freq = inv_freq
        self._entries: OrderedDict[tuple[int | None, tuple[int, ...]], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.counters = CacheCounters()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: list[int], touch: bool = True, depth: int | None = None,
               cursor: int | None = None) -> tuple[KVCache | None, int]:
        """A private copy of the cache of `depth` sharing the longest token prefix with `ids`,
        cropped to that prefix, and its length; (None, 0) when no entry shares a token. `touch`
        False (a prefetch): the entries' order of use and the counters stay as they were.
        `cursor`: the position of the cursor in `ids`, around which `near` keeps the copy limit."""
        guarded = (cursor - self.near, cursor + self.near) if self.near and cursor is not None else None
        runs = Runs(ids, self.min_chunk) if self.min_chunk else None
        with self._lock:
            if touch:
                self.counters.lookups += 1
            best_key, best, wanted = None, 0, tuple(ids)
            for key in self._entries:
                if key[0] != depth:
                    continue
                n = common_prefix_length(key[1], wanted)
                if n > best:
                    best_key, best = key, n
            chunks = []
            if self.min_chunk:
                candidates = self._recent(depth)
                if best_key is not None and best_key not in candidates:
                    candidates.append(best_key)  # the editor's own last prompt, however many came since
                reused, recent, plan = max((self._reused_by(key, runs, guarded) for key in candidates),
                                           default=(0, None, []), key=lambda c: c[0])  # ties: the most recent
                if reused > best:
                    best_key, best, chunks = recent, reused, plan
            if best_key is None:
                return None, 0
            source = self._entries[best_key].cache
            if touch:
                self._entries.move_to_end(best_key)
                self.counters.hits += 1
                self.counters.reused_tokens += best
        # entries are never mutated in place, so copying outside the lock is safe
        room = -(-len(ids) // SPAN) * SPAN  # what the prompt's prefill will need
        if chunks:
            return assemble(source, chunks, len(ids), self.inv_freq, room), best
        return source.copy(best, room), best

    def _recent(self, depth: int | None) -> list[tuple[int | None, tuple[int, ...]]]:
        """The prompts chunk reuse plans against: the most recently used of `depth`, one per editor
        that a server shared by a few editors took turns with (the last alone would be another
        editor's)."""
        return list(islice((key for key in reversed(self._entries) if key[0] == depth), RECENT_PROMPTS))

    def _reused_by(self, key, runs: Runs, guarded: tuple[int, int] | None) -> tuple[int, tuple, list]:
        """(tokens reused, key, chunks) of the prompt of `runs` planned against the entry `key`."""
        entry = self._entries[key]
        chunks = plan_chunks(entry.runs, runs)
        if self.copy_limit:
            chunks = split_stale(chunks, entry.cache.copies, self.copy_limit, self.min_chunk, guarded)
        return sum(c.end - c.start for c in chunks), key, chunks

    def store(self, ids: list[int], cache: KVCache, depth: int | None = None) -> bool:
        """Keep the first len(ids) positions of `cache` (which must hold them in every layer),
        computed by a method of prompt depth `depth`. Not where a longer entry starts with `ids`
        (a request cancelled in its prefill): it would add nothing, and it would push a whole prompt
        out of the recent ones that chunk reuse plans against."""
        n, key = len(ids), (depth, tuple(ids))
        if n == 0 or min(cache.lengths) < n:
            return False
        with self._lock:
            if any(k[0] == depth and len(k[1]) > n and k[1][:n] == key[1] for k in self._entries):
                return False
        cache.crop(n)
        kept = cache.copy(n)  # trims the buffers to the prompt, so nbytes is what is kept
        size = kept.nbytes()
        if size > self.max_bytes:
            return False
        entry = _Entry(kept, Runs(key[1], self.min_chunk) if self.min_chunk else None)
        with self._lock:
            older = [k for k in self._entries if k[0] == depth and len(k[1]) <= n and key[1][: len(k[1])] == k[1]]
            for old in older:
                self._bytes -= self._entries.pop(old).cache.nbytes()
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.cache.nbytes()
                self.counters.evictions += 1
        return True
