"""Proposers: cheap ways of drafting the next tokens, one class each, behind one interface.

- `LookupProposer`: n-gram (prompt) lookup in the prompt and the text generated so far, then in
  the client's earlier requests (`params.history`); costs nothing to propose, its length follows
  the evidence (match length, acceptance so far).
- `SelfDraftProposer`: the model's own first E layers + an exit head over a reduced vocabulary;
  the drafted positions' keys/values for layers 0..E-1 stay in the cache and their layer-E hidden
  states go to verification, which runs only layers E..L-1 (LayerSkip's KV sharing).
- `DraftModelProposer`: a separate smaller model with the same tokenizer and its own cache.
- `LookupThenSelf`: n-gram drafts where the context has a match, self-drafts otherwise.
- `RetrievalProposer`: the most frequent continuation of the context's longest tail in a datastore
  of code (REST), or the context's own lookup, whichever promises more per unit of work.

The decode loop calls `begin` once per request: it returns a copy of the proposer that holds that
request's state (index, shortlist, draft cache, acceptance statistics), so the method object a
server keeps is never changed by a request: it serves concurrent requests, and no request's
statistics reach another. Per step the loop calls that copy's `propose` (the context is prompt +
emitted tokens; its last token sits at `position` and is not in the cache yet) and `feedback`.
Work done while drafting is added to the request's `Stats` here.
"""

from __future__ import annotations

import copy

import torch

from ..energy.work import full_pass_macs, head_macs, layer_macs
from ..engine.sampling import draw
from ..exits.shortlist import Shortlist
from .draft_control import AcceptanceTracker, ExitLayerController, best_length, best_tree_size, expected_tokens
from .verify import Draft

VERIFY_COST = 0.1  # wall time of one extra verified position, relative to one decode step (CPU)
PROBE_EVERY = 4  # a match whose drafts do not pay still drafts one token every 4th time


class Proposer:
    name = "proposer"
    token_chains = False  # drafts only chains of token ids, each with its `rates`: a server may batch its passes

    def begin(self, model, prompt_ids: list[int], params, generator, stats) -> "Proposer":
        """The proposer for one request: a shallow copy of this one, started on the request."""
        run = copy.copy(self)
        run.start(model, prompt_ids, params, generator, stats)
        return run

    def start(self, model, prompt_ids: list[int], params, generator, stats) -> None:
        """Set up one request's state (called on the copy that `begin` made)."""
        self.params, self.generator, self.stats = params, generator, stats

    def propose(self, model, cache, context: list[int], position: int) -> Draft:
        raise NotImplementedError

    def feedback(self, draft: Draft, accepted: int) -> None:
        """How many of the draft's tokens verification accepted."""


class LookupProposer(Proposer):
    """Prompt lookup decoding: find the latest earlier occurrence of the context's last n tokens
    (longest n first) and draft what followed it; where the context has none, the same in
    `params.history` (earlier requests' text: the server's cross-request n-gram cache, as
    llama.cpp's ngram-cache and vLLM's suffix decoding keep one). One acceptance tracker per
    source and match length sets the draft length by expected tokens per unit of verification
    work."""

    name = "lookup"
    token_chains = True

    def __init__(self, max_draft: int = 10, max_ngram: int = 3, min_ngram: int = 1, verify_cost: float = VERIFY_COST):
        self.max_draft = max_draft
        self.sizes = list(range(max_ngram, min_ngram - 1, -1))
        self.verify_cost = verify_cost

    def start(self, model, prompt_ids, params, generator, stats):
        super().start(model, prompt_ids, params, generator, stats)
        keys = [(source, n) for source in (self.name, "history") for n in self.sizes]
        self.trackers = {key: AcceptanceTracker(self.max_draft) for key in keys}  # this request's evidence
        self.unprofitable = dict.fromkeys(keys, 0)
        self.index: dict[tuple, int] = {}  # n-gram -> index of the token that followed it (latest)
        self.indexed = 1
        self.history = list(params.history)
        self.history_index: dict[tuple, int] | None = None  # indexed where the context first has no match
        self.matched = None  # (source, n) of the last draft

    def _extend(self, index: dict, tokens: list[int], first: int) -> None:
        for i in range(first, len(tokens)):
            for n in self.sizes:
                if i >= n:
                    index[tuple(tokens[i - n : i])] = i

    def propose(self, model, cache, context, position):
        self._extend(self.index, context, self.indexed)  # continuations before the last token: never the suffix
        self.indexed = len(context)
        self.matched = None
        source, tokens, found = self.name, context, self._longest_match(self.index, context)
        if found is None:
            source, tokens, found = "history", self.history, self._longest_match(self._history_index(), context)
        if found is None:
            return Draft([], source=self.name)
        n, start = found
        self.matched = (source, n)
        rates = self.trackers[self.matched].rates()
        k, _ = best_length(rates, self.verify_cost, self.max_draft)
        if k == 0:  # not worth it by the evidence so far; probe one token now and then to update it
            self.unprofitable[self.matched] += 1
            k = int(self.unprofitable[self.matched] % PROBE_EVERY == 0)
        drafted = tokens[start : start + k]
        return Draft(drafted, source=self.matched[0], rates=rates[: len(drafted)])

    def _longest_match(self, index: dict[tuple, int], context: list[int]) -> tuple[int, int] | None:
        """(n, where its continuation starts) for the longest of the context's last n-grams in `index`."""
        for n in self.sizes:
            start = index.get(tuple(context[-n:])) if len(context) >= n else None
            if start is not None:
                return n, start
        return None

    def _history_index(self) -> dict[tuple, int]:
        """The history's n-grams (up to 4,096 tokens), indexed at their first use: the prompt has
        a match at most steps, and indexing them all took milliseconds before the first token."""
        if self.history_index is None:
            self.history_index = {}
            self._extend(self.history_index, self.history, 1)
        return self.history_index

    def feedback(self, draft, accepted):
        if draft.tokens:
            self.trackers[self.matched].update(len(draft.tokens), accepted)


class SelfDraftProposer(Proposer):
    """Draft with the model's first E layers and exit head E over a shortlist of token ids (the
    train split's most frequent tokens, `exits/shortlist.py`, in the head's weight format), plus
    every token of the context;
    a token outside the shortlist simply cannot be drafted. The head is the costly part of a small
    model (design.md section 4), so the shortlist cuts the draft cost several-fold.

    Fixed mode: exit layer `layer`, `max_draft` tokens. Dynamic mode (`controller`): the
    controller picks layer and length per step, and `stop` may end a draft early."""

    name = "self"

    def __init__(self, heads, layer: int | None = None, max_draft: int = 4, stop=None,
                 controller: ExitLayerController | None = None, shortlist: int = 4096):
        if controller is None and layer not in heads.layers:
            raise ValueError(f"exit layer {layer} has no head; heads exist for layers {heads.layers}")
        self.heads = heads
        self.layer = layer
        self.max_draft = max_draft
        self.stop = stop
        self.controller = controller
        self.base = Shortlist(heads.model, shortlist)  # built once, shared by every request

    def start(self, model, prompt_ids, params, generator, stats):
        super().start(model, prompt_ids, params, generator, stats)
        if self.controller is not None:
            self.controller = self.controller.fresh()  # from the priors: this request's evidence only
        self.shortlist = self.base.for_request()

    def _draft_logits(self, model, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        self.stats.extra_macs += self.shortlist.macs() + self.heads.map_macs()
        return self.shortlist.logits(self.heads.normed(layer, hidden))

    def propose(self, model, cache, context, position):
        self.shortlist.grow(context)
        layer, k = self.controller.choose() if self.controller else (self.layer, self.max_draft)
        token, hiddens, tokens, probs = context[-1], [], [], []
        for j in range(k + 1):
            ctx = model.context(torch.tensor([position + j], device=model.device))
            h = model.embed(torch.tensor([token], device=model.device), ctx)
            for i in range(layer):
                h = model.run_layer(i, h, ctx, cache)
            hiddens.append(h)
            self.stats.layer_evals += layer
            if j == k:
                break
            logits = self._draft_logits(model, layer, h)
            if self.stop is not None and self.stop.stop(torch.softmax(logits, -1)):
                break
            index, q = draw(logits, self.params, self.generator)
            if q is not None:
                ids = self.shortlist.index.to(q.device)
                probs.append(torch.zeros(model.vocab_size, device=q.device).index_put_((ids,), q))
            token = self.shortlist.token(index)
            tokens.append(token)
        return Draft(tokens, torch.stack(probs) if probs else None, torch.cat(hiddens, dim=1), layer, self.name)

    def feedback(self, draft, accepted):
        if self.controller is not None:
            self.controller.update(draft.start_layer, len(draft.tokens), accepted)


def self_draft_costs(model, heads, shortlist: int, verify_cost: float = VERIFY_COST) -> dict[int, float]:
    """Work of self-drafting one token from each exit layer, relative to one full decode step:
    E layers + translator + shortlist head, plus the extra verified position."""
    full = full_pass_macs(model)
    small = shortlist * model.hidden_size + heads.map_macs()
    return {e: (e * layer_macs(model) + small) / full + verify_cost for e in heads.layers}


class DraftModelProposer(Proposer):
    """A smaller model of the same tokenizer drafts `max_draft` tokens with its own KV cache,
    which keeps every token it has seen that is still in the context (rolled back otherwise).

    `tree=True`: the draft model's greedy chain plus, at each depth, its runner-up token as a leaf
    beside the chain's token where the draft model gives it at least SIBLING_MIN of its mass
    (multi-candidate drafting at no extra draft-model work: the runner-up is in the logits the
    chain needed anyway); verified as one token tree."""

    name = "draft-model"
    SIBLING_MIN = 0.1

    def __init__(self, draft_model, target, max_draft: int = 4, tree: bool = False):
        if len(draft_model.tokenizer) != len(target.tokenizer) or draft_model.vocab_size > target.vocab_size:
            raise ValueError(f"{draft_model.name} and {target.name} do not share a tokenizer")
        self.draft = draft_model
        self.max_draft = max_draft
        self.tree = tree
        self.token_macs = draft_model.num_layers * layer_macs(draft_model)
        self.head_macs = head_macs(draft_model)

    def start(self, model, prompt_ids, params, generator, stats):
        """The draft model's own prompt pass (prefill work, timed as such by `prepare`)."""
        super().start(model, prompt_ids, params, generator, stats)
        self.cache = self.draft.new_cache()
        self._run(list(prompt_ids), 0)  # its logits go unused: drafts start after the first token
        self.seen = list(prompt_ids)

    def _run(self, ids: list[int], start: int) -> torch.Tensor:
        self.stats.extra_macs += len(ids) * self.token_macs + self.head_macs
        return self.draft.forward(torch.tensor(ids, device=self.draft.device), self.cache, start=start)[0, -1]

    def propose(self, model, cache, context, position):
        common = 0
        limit = min(len(self.seen), len(context) - 1)  # the last token must run to give logits
        while common < limit and self.seen[common] == context[common]:
            common += 1
        self.cache.crop(common)
        logits = self._run(context[common:], common)
        self.seen = list(context)
        if self.tree:
            return self._tree(logits)
        tokens, probs = [], []
        for j in range(self.max_draft):
            token, q = draw(logits, self.params, self.generator)
            if q is not None:
                probs.append(torch.nn.functional.pad(q, (0, model.vocab_size - q.shape[0])))
            tokens.append(token)
            if j + 1 < self.max_draft:
                logits = self._advance(token)
        return Draft(tokens, torch.stack(probs) if probs else None, source=self.name)

    def _advance(self, token: int) -> torch.Tensor:
        """The draft model's logits after it reads its own drafted `token`."""
        logits = self._run([token], len(self.seen))
        self.seen.append(token)
        return logits

    def _tree(self, logits: torch.Tensor) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1  # the chain's last token so far
        for j in range(self.max_draft):
            top = torch.topk(torch.softmax(logits.float().reshape(-1), dim=-1), 2)
            first, second = (int(t) for t in top.indices)
            tokens.append(first)
            parents.append(parent)
            chain = len(tokens) - 1
            if float(top.values[1]) >= self.SIBLING_MIN:
                tokens.append(second)
                parents.append(parent)
            parent = chain
            if j + 1 < self.max_draft:
                logits = self._advance(first)
        return Draft(tokens, source=self.name, parents=parents)


class LookupThenSelf(Proposer):
    """n-gram lookup where the context offers a match (free), a self-draft otherwise."""

    name = "lookup+self"

    def __init__(self, lookup: LookupProposer, self_draft: SelfDraftProposer):
        self.lookup, self.self_draft = lookup, self_draft
        self.used: Proposer = lookup

    def start(self, model, prompt_ids, params, generator, stats):
        super().start(model, prompt_ids, params, generator, stats)
        self.lookup = self.lookup.begin(model, prompt_ids, params, generator, stats)
        self.self_draft = self.self_draft.begin(model, prompt_ids, params, generator, stats)
        self.used = self.lookup

    def propose(self, model, cache, context, position):
        draft = self.lookup.propose(model, cache, context, position)
        self.used = self.lookup
        if not draft.tokens:
            draft = self.self_draft.propose(model, cache, context, position)
            self.used = self.self_draft
        return draft

    def feedback(self, draft, accepted):
        self.used.feedback(draft, accepted)


class RetrievalProposer(Proposer):
    """REST-style drafting from a `Datastore`: the longest tail of the context (up to `max_match`
    tokens) found in the store, and the continuations of its occurrences. The context's own n-gram
    lookup takes part at every step.

    As a chain (default): the store's most frequent continuation, cut where fewer than `floor` of
    the occurrences agree, or the lookup's draft, whichever promises more per unit of work, each
    source with its own acceptance trackers (the store's per matched length).

    As a tree (`tree=True`): every continuation prefix that at least `min_share` of the
    occurrences start with, and the lookup's draft, each node valued at its estimated chance of
    acceptance: its parent's times the acceptance measured so far for nodes whose parent was
    accepted, by bucket of the node's share among its parent's occurrences (for the lookup's
    draft, its per-position acceptance rates). The tree keeps the most valued nodes up to the size
    that maximises expected tokens per unit of verification work (EAGLE-2's selection, DySpec's
    stopping rule with the measured verify cost). On this CPU, where each verified position costs
    about a fifth of a decode step, trees gave more tokens per verification but less speed than
    the chain (README, "Drafting from a datastore")."""

    name = "retrieval"
    MIN_MATCH = 2  # a one-token tail says little about what follows
    TREE_DEPTH = 8
    SHARE_EDGES = (0.1, 0.25, 0.5, 0.75, 0.9)  # buckets of a node's share among its parent's occurrences

    def __init__(self, store, max_draft: int = 10, verify_cost: float = VERIFY_COST, max_match: int = 24,
                 floor: float = 0.3, tree: bool = False, min_share: float = 0.05):
        self.store, self.max_draft, self.verify_cost = store, max_draft, verify_cost
        self.max_match, self.floor, self.tree, self.min_share = max_match, floor, tree, min_share
        self.lookup_template = LookupProposer(max_draft, verify_cost=verify_cost)

    def start(self, model, prompt_ids, params, generator, stats):
        super().start(model, prompt_ids, params, generator, stats)
        self.lookup = self.lookup_template.begin(model, prompt_ids, params, generator, stats)
        self.trackers = {n: AcceptanceTracker(self.max_draft) for n in range(self.MIN_MATCH, 9)}
        self.unprofitable = 0
        self.used: AcceptanceTracker | None = None
        # per share bucket: [accepted, tried] for store nodes whose parent was accepted, a prior of
        # two tries at the bucket's lower edge
        lows = (0.05,) + self.SHARE_EDGES
        self.by_share = [[2 * low, 2.0] for low in lows]
        self.nodes: list[tuple[tuple[int, ...], str, int | None]] = []  # the last tree: path, source, bucket
        self.context_draft: list[int] = []

    def _value(self, tracker: AcceptanceTracker, k: int) -> float:
        return expected_tokens(tracker.rates(), k) / (1.0 + k * self.verify_cost)

    # -- chain --------------------------------------------------------------------------------

    def _chain_from_store(self, context: list[int]) -> tuple[list[int], AcceptanceTracker | None, float]:
        n, lo, hi = self.store.longest_match(context, self.max_match)
        if n < self.MIN_MATCH:
            return [], None, 0.0
        tokens = []
        for step in self.store.continuation(lo, hi, self.max_draft):
            if step.count < self.floor * step.of:
                break
            tokens.append(step.token)
        tracker = self.trackers[min(n, 8)]
        k, value = best_length(tracker.rates(), self.verify_cost, len(tokens))
        if k == 0 and tokens:  # not worth it by the evidence so far: probe one token now and then
            self.unprofitable += 1
            k = int(self.unprofitable % PROBE_EVERY == 0)
        return tokens[:k], tracker, value

    def _chain(self, from_context: Draft, context: list[int]) -> Draft:
        context_value = (self._value(self.lookup.trackers[self.lookup.matched], len(from_context.tokens))
                         if from_context.tokens else 0.0)
        tokens, tracker, value = self._chain_from_store(context)
        if tokens and value > context_value:
            self.used = tracker
            return Draft(tokens, source="datastore")
        self.used = None
        return Draft(from_context.tokens, source=self._lookup_source(from_context))

    def _lookup_source(self, draft: Draft) -> str:
        """Where a lookup draft came from: the request's own text ("context") or "history"."""
        return "context" if draft.source == self.lookup.name else draft.source

    # -- tree ---------------------------------------------------------------------------------

    def _bucket(self, share: float) -> int:
        return sum(share >= edge for edge in self.SHARE_EDGES)

    def _candidates(self, from_context: Draft, context: list[int]) -> dict[tuple[int, ...], tuple[float, str, int | None]]:
        """path -> (estimated chance of acceptance, source, share bucket for store nodes)."""
        found: dict[tuple[int, ...], tuple[float, str, int | None]] = {}
        n, lo, hi = self.store.longest_match(context, self.max_match)
        if n >= self.MIN_MATCH:
            paths, shares = self.store.tree(lo, hi, min(self.TREE_DEPTH, self.max_draft), self.min_share)
            share_of = dict(zip(paths, shares))
            for path in sorted(paths, key=len):  # parents first
                bucket = self._bucket(share_of[path] / share_of.get(path[:-1], 1.0))
                hits, tries = self.by_share[bucket]
                parent = found[path[:-1]][0] if len(path) > 1 else 1.0
                found[path] = (parent * hits / tries, "datastore", bucket)
        run = 1.0
        rates = self.lookup.trackers[self.lookup.matched].rates() if from_context.tokens else []
        for d, rate in enumerate(rates[: len(from_context.tokens)]):
            run *= rate
            path = tuple(from_context.tokens[: d + 1])
            if run > found.get(path, (0.0,))[0]:
                found[path] = (run, self._lookup_source(from_context), found.get(path, (0.0, "", None))[2])
        return found

    def _tree(self, from_context: Draft, context: list[int]) -> Draft:
        found = self._candidates(from_context, context)
        order = sorted(found, key=lambda path: (-found[path][0], len(path)))[: self.max_draft]
        size = best_tree_size([found[path][0] for path in order], self.verify_cost)
        chosen = sorted(order[:size], key=len)  # parents before children (a prefix is never less likely)
        index = {path: i for i, path in enumerate(chosen)}
        self.nodes = [(path, found[path][1], found[path][2]) for path in chosen]
        self.context_draft = list(from_context.tokens)
        sources = {found[path][1] for path in chosen}
        return Draft([path[-1] for path in chosen], source="+".join(sorted(sources)) or "datastore",
                     parents=[index[path[:-1]] if len(path) > 1 else -1 for path in chosen])

    def propose(self, model, cache, context, position):
        from_context = self.lookup.propose(model, cache, context, position)
        return self._tree(from_context, context) if self.tree else self._chain(from_context, context)

    def feedback(self, draft, accepted):
        if not draft.tokens:
            return
        if not self.tree:
            if self.used is not None:
                self.used.update(len(draft.tokens), accepted)
            else:
                self.lookup.feedback(draft, accepted)
            return
        path = tuple(draft.tokens[i] for i in draft.accepted)
        for node, _, bucket in self.nodes:  # store nodes whose parent was accepted: was the node?
            if bucket is not None and node[:-1] == path[: len(node) - 1]:
                counts = self.by_share[bucket]
                counts[0], counts[1] = 0.99 * counts[0] + (node == path[: len(node)]), 0.99 * counts[1] + 1
        held = {node for node, _, _ in self.nodes}
        drafted = 0
        while drafted < len(self.context_draft) and tuple(self.context_draft[: drafted + 1]) in held:
            drafted += 1
        if drafted:  # the lookup's draft as far as the tree held it, and how much of it landed
            agreed = 0
            while agreed < min(drafted, len(path)) and path[agreed] == self.context_draft[agreed]:
                agreed += 1
            self.lookup.feedback(Draft(self.context_draft[:drafted]), agreed)
