"""STAND-style stochastic n-gram drafting: next-token distributions per context, not one match.

Plain lookup (`LookupProposer`) drafts what followed the latest occurrence of the context's
tail. STAND (Song et al., 2025) keeps, per n-gram, the distribution of what followed it and
drafts the likeliest continuations, as a chain or a tree. Here the distribution is the counts of
every token seen after each 1-, 2- and 3-gram of the request's text (prompt and generated
tokens), or, where that text has no match, of the client's earlier completions (`params.history`).
Each drafted token is valued by the acceptance measured so far for tokens of its kind (matched
n-gram length, share of the count, seen once or more), so the draft length and the tree follow the evidence, with
the same expected-tokens-per-unit-of-work rule as the other proposers.
"""

from __future__ import annotations

import heapq

from .draft_control import best_length, best_tree_size
from .proposers import PROBE_EVERY, VERIFY_COST, Proposer
from .verify import Draft

SHARE_EDGES = (0.25, 0.5, 0.75, 0.9)  # buckets of a token's share of its n-gram's count
SEEN_ONCE_PRIOR = 0.35  # a continuation seen once has share 1 but says little (lookup's first token: 0.46)


class NgramCounts:
    """n-gram -> {next token: [count, index of its latest occurrence]}, for n in `sizes`."""

    def __init__(self, sizes: list[int]):
        self.sizes = sizes  # longest first
        self.table: dict[tuple[int, ...], dict[int, list[int]]] = {}

    def extend(self, tokens: list[int], first: int) -> None:
        """Count the continuations tokens[first:] (each after the n tokens before it)."""
        for i in range(max(first, 1), len(tokens)):
            for n in self.sizes:
                if i >= n:
                    seen = self.table.setdefault(tuple(tokens[i - n : i]), {}).setdefault(tokens[i], [0, 0])
                    seen[0] += 1
                    seen[1] = i

    def matches(self, tail: tuple[int, ...]) -> bool:
        """Whether some n-gram ending `tail` was seen (what `next` would rank, without ranking it)."""
        return any(len(tail) >= n and tail[-n:] in self.table for n in self.sizes)

    def next(self, tail: tuple[int, ...]) -> tuple[int, list[tuple[int, float, int]]] | None:
        """(n of the longest matched n-gram ending `tail`, [(token, share, count)] likeliest first,
        ties to the latest occurrence, as plain lookup), or None where no n-gram matches."""
        for n in self.sizes:
            found = self.table.get(tail[-n:]) if len(tail) >= n else None
            if found:
                total = sum(count for count, _ in found.values())
                ranked = sorted(found.items(), key=lambda item: (-item[1][0], -item[1][1]))
                return n, [(token, count / total, count) for token, (count, _) in ranked]
        return None


class StandProposer(Proposer):
    """Drafts the likeliest continuations under the n-gram counts: one chain (`tree=False`), or a
    tree of up to `branch` children a node (those with at least `min_share` of its count), grown
    best-first by estimated acceptance and cut at the size with the most expected tokens per unit
    of verification work."""

    name = "stand"

    def __init__(self, max_draft: int = 10, max_ngram: int = 3, verify_cost: float = VERIFY_COST,
                 tree: bool = False, branch: int = 3, min_share: float = 0.1):
        self.max_draft, self.verify_cost = max_draft, verify_cost
        self.sizes = list(range(max_ngram, 0, -1))
        self.branch, self.min_share = (branch if tree else 1), min_share

    def start(self, model, prompt_ids, params, generator, stats):
        super().start(model, prompt_ids, params, generator, stats)
        self.tables = {self.name: NgramCounts(self.sizes), "history": NgramCounts(self.sizes)}
        self.tables["history"].extend(list(params.history), 1)
        self.indexed = 1
        # per kind (matched n, share bucket, seen more than once): [accepted, tried] for drafted
        # tokens whose parent was accepted; a prior of two tries at the bucket's lower edge, or at
        # SEEN_ONCE_PRIOR for a continuation seen once (a line completion has few steps to learn in)
        lows = (0.1,) + SHARE_EDGES
        self.by_kind = {(n, b, seen): [2 * (low if seen else SEEN_ONCE_PRIOR), 2.0]
                        for n in self.sizes for b, low in enumerate(lows) for seen in (False, True)}
        self.nodes: list[tuple[tuple[int, ...], tuple]] = []  # the last draft: path, kind
        self.unprofitable = 0

    def _rate(self, kind: tuple) -> float:
        hits, tries = self.by_kind[kind]
        return hits / tries

    def _children(self, table: NgramCounts, tail: tuple[int, ...]) -> list[tuple[int, tuple]]:
        found = table.next(tail)
        if found is None:
            return []
        n, ranked = found
        kept = [item for item in ranked[: self.branch] if item[1] >= self.min_share] or ranked[:1]
        return [(token, (n, sum(share >= edge for edge in SHARE_EDGES), count > 1)) for token, share, count in kept]

    def _grow(self, table: NgramCounts, tail: tuple[int, ...]) -> dict[tuple[int, ...], tuple[float, tuple]]:
        """path -> (estimated chance that verification accepts it, kind of its last token), best first."""
        found: dict[tuple[int, ...], tuple[float, tuple]] = {}
        frontier = [(-1.0, ())]
        while frontier and len(found) < self.max_draft:
            value, path = heapq.heappop(frontier)
            if len(path) >= self.max_draft:
                continue
            for token, kind in self._children(table, (tail + path)[-self.sizes[0]:]):
                child = path + (token,)
                found[child] = (-value * self._rate(kind), kind)
                heapq.heappush(frontier, (-found[child][0], child))
        return found

    def propose(self, model, cache, context, position):
        self.tables[self.name].extend(context, self.indexed)
        self.indexed = len(context)
        tail = tuple(context[-self.sizes[0]:])
        source = next((s for s, table in self.tables.items() if table.matches(tail)), None)
        self.nodes = []
        if source is None:
            return Draft([], source=self.name)
        found = self._grow(self.tables[source], tail)
        if self.branch == 1:  # a chain: the length rule of the other chains, per position
            chain = max(found, key=len)
            order = [chain[: d + 1] for d in range(len(chain))]
            size, _ = best_length([self._rate(found[path][1]) for path in order], self.verify_cost)
        else:  # a tree: the likeliest nodes, as many as pay for their verification
            order = sorted(found, key=lambda path: (-found[path][0], len(path)))[: self.max_draft]
            size = best_tree_size([found[path][0] for path in order], self.verify_cost)
        if size == 0:  # not worth it by the evidence so far; probe one token now and then to update it
            self.unprofitable += 1
            size = int(self.unprofitable % PROBE_EVERY == 0)
        chosen = sorted(order[:size], key=len)  # parents first: a node is never likelier than its parent
        self.nodes = [(path, found[path][1]) for path in chosen]
        tokens = [path[-1] for path in chosen]
        if self.branch == 1 or not chosen:
            return Draft(tokens, source=source)
        index = {path: i for i, path in enumerate(chosen)}
        return Draft(tokens, source=source, parents=[index.get(path[:-1], -1) for path in chosen])

    def feedback(self, draft, accepted):
        taken = draft.accepted if draft.parents is not None else range(accepted)
        path = tuple(draft.tokens[i] for i in taken)
        for node, kind in self.nodes:  # tokens whose parent was accepted: was the token?
            if node[:-1] == path[: len(node) - 1]:
                counts = self.by_kind[kind]
                counts[0], counts[1] = 0.99 * counts[0] + (node == path[: len(node)]), 0.99 * counts[1] + 1
