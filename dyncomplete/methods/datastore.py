"""A datastore of tokenized code for retrieval drafting (REST, He et al. 2024, with exact matching).

`dyncomplete index` tokenizes source files once with a model's tokenizer, joins them with a
separator id that no token has, and sorts all suffixes of the reversed text (libdivsufsort
through pydivsufsort). Reversed, the tails of a context are nested prefixes: one pass of binary
searches, a token at a time, narrows to the occurrences of the longest tail (`longest_match`).
`continuation` then walks, among (a sample of) those occurrences, the most frequent next token,
then the most frequent one after it among those that continued so, and so on, with counts.

A store lives in the cache under the model and a name (`datastores/MODEL/NAME`), never at a path
a request gives: a server method `retrieval:NAME` reads only stores an operator built.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..paths import cache_root

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SAMPLE = 4096  # occurrences looked at to pick the most frequent next token of a larger range
TREE_SAMPLE = 512  # occurrences whose continuations make a token tree
PAD = 64  # separators around the text, so that reads near its ends stay inside


def tokenizer_digest(tokenizer) -> str:
    """What a store's token ids mean: a digest of the vocabulary (id for every token string)."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return hashlib.sha256(vocab.encode()).hexdigest()[:16]


def store_dir(model_name: str, name: str) -> Path:
    if not NAME.fullmatch(name):
        raise ValueError(f"bad datastore name {name!r}: letters, digits, '.', '_' or '-', at most 64")
    return cache_root() / "datastores" / re.sub(r"[^A-Za-z0-9._-]", "_", model_name) / name


@dataclass
class Step:
    """One drafted token of a continuation: how many occurrences continue with it, out of how
    many that reached its depth."""

    token: int
    count: int
    of: int


class Datastore:
    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, meta: dict):
        self.tokens, self.suffixes, self.meta = tokens, suffixes, meta
        self.separator = int(meta["separator"])
        self.size = len(suffixes)

    # -- building and storage ---------------------------------------------------------------

    @classmethod
    def build(cls, documents, separator: int, meta: dict | None = None) -> "Datastore":
        """`documents`: lists of token ids; `separator`: an id no token has (the vocabulary size)."""
        from pydivsufsort import divsufsort

        started = time.perf_counter()
        pad = np.full(PAD, separator, dtype=np.int32)
        parts = [pad]
        for doc in documents:
            parts += [np.asarray(doc, dtype=np.int32), pad[:1]]
        tokens = np.concatenate(parts + [pad])
        suffixes = divsufsort(np.ascontiguousarray(tokens[::-1])).astype(np.int32)
        documents = len(parts) // 2
        meta = dict(meta or {}, separator=separator, tokens=int(len(tokens) - 2 * PAD - documents), documents=documents,
                    sort_seconds=round(time.perf_counter() - started, 2))
        return cls(tokens, suffixes, meta)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "tokens.npy", self.tokens)
        np.save(folder / "suffixes.npy", self.suffixes)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=1) + "\n")

    @classmethod
    def open(cls, folder: Path) -> "Datastore":
        """The store in `folder`, its arrays memory-mapped (opening costs no reading)."""
        if not (folder / "meta.json").is_file():
            raise ValueError(f"no datastore in {folder}: build one with `dyncomplete index`")
        meta = json.loads((folder / "meta.json").read_text())
        return cls(np.load(folder / "tokens.npy", mmap_mode="r"), np.load(folder / "suffixes.npy", mmap_mode="r"),
                   meta)

    @classmethod
    def for_model(cls, model, name: str) -> "Datastore":
        """Store `name` built for `model`'s tokenizer (refused if the vocabulary differs)."""
        store = cls.open(store_dir(model.name, name))
        if store.meta.get("tokenizer") != tokenizer_digest(model.tokenizer):
            raise ValueError(f"datastore {name!r} was built with another tokenizer than {model.name}'s: rebuild it "
                             f"with `dyncomplete index --model {model.name} --name {name}`")
        return store

    # -- lookup ---------------------------------------------------------------------------------

    def _token(self, i: int, offset: int) -> int:
        """Token `offset` of reversed suffix i: `offset` places before the text position it starts at."""
        return int(self.tokens[len(self.tokens) - 1 - int(self.suffixes[i]) - offset])

    def longest_match(self, context: list[int], max_len: int) -> tuple[int, int, int]:
        """(n, lo, hi): the longest tail of `context` (n tokens, at most `max_len`) that occurs in
        the store, and the range of reversed suffixes that start with it; n = 0 if none."""
        lo, hi, n = 0, self.size, 0
        for offset in range(min(max_len, len(context))):
            token = context[-1 - offset]
            key = functools.partial(self._token, offset=offset)
            new_lo = bisect.bisect_left(range(lo, hi), token, key=key) + lo
            new_hi = bisect.bisect_right(range(new_lo, hi), token, key=key) + new_lo
            if new_lo == new_hi:
                break
            lo, hi, n = new_lo, new_hi, offset + 1
        return (n, lo, hi) if n else (0, 0, 0)

    def _next_indices(self, lo: int, hi: int, sample: int) -> np.ndarray:
        """Where the token after each of the occurrences lo..hi sits (about `sample` of them,
        evenly spaced, if there are more)."""
        stride = max(1, (hi - lo) // sample)
        return len(self.tokens) - np.asarray(self.suffixes[lo:hi:stride], dtype=np.int64)

    def continuation(self, lo: int, hi: int, steps: int) -> list[Step]:
        """Up to `steps` tokens after the occurrences lo..hi (a sample of SAMPLE if more): each
        the most frequent next token among the occurrences that continued with the earlier ones."""
        after = self._next_indices(lo, hi, SAMPLE)
        out = []
        for offset in range(steps):
            seen = self.tokens[after + offset]
            values, counts = np.unique(seen, return_counts=True)
            best = int(np.argmax(counts))
            token = int(values[best])
            if token == self.separator:
                break
            out.append(Step(token, int(counts[best]), len(after)))
            after = after[seen == token]
        return out

    def tree(self, lo: int, hi: int, depth: int, min_share: float) -> tuple[list[tuple[int, ...]], list[float]]:
        """The continuations of occurrences lo..hi (a sample of TREE_SAMPLE if more) as a trie:
        every prefix of at most `depth` tokens that at least `min_share` of them start with, and
        that share, most common first (a prefix before its extensions)."""
        after = self._next_indices(lo, hi, TREE_SAMPLE)
        grid = self.tokens[after[:, None] + np.arange(depth)]  # (occurrences, depth)
        grid = grid[np.lexsort(grid.T[::-1])]  # sorted rows: equal prefixes are adjacent
        total, need = len(grid), max(1, int(np.ceil(min_share * len(grid))))
        paths, shares = [], []
        new_group = np.zeros(total, dtype=bool)
        for d in range(depth):
            if total > 1:
                new_group[1:] |= grid[1:, d] != grid[:-1, d]
            new_group[0] = True
            starts = np.flatnonzero(new_group)
            sizes = np.diff(np.append(starts, total))
            for start, size in zip(starts[sizes >= need], sizes[sizes >= need]):
                path = tuple(int(t) for t in grid[start, : d + 1])
                if self.separator not in path:
                    paths.append(path)
                    shares.append(size / total)
        order = sorted(range(len(paths)), key=lambda i: (-shares[i], len(paths[i])))
        return [paths[i] for i in order], [shares[i] for i in order]
