"""Verification of a draft: score it with the full model in one pass, then accept or reject.

`score` runs the model over the last emitted token and the drafted tokens at once, starting from
the layer the draft reached (0 for drafts given as token ids, the exit layer for self-drafts whose
shallow layers already ran). Greedy acceptance keeps the longest prefix that agrees with the
model's argmax; at temperature > 0 speculative sampling (Leviathan et al. 2023, Chen et al. 2023)
accepts a drafted token x with probability min(1, p(x) / q(x)) and on rejection draws from the
residual max(0, p - q), so every emitted token has exactly the distribution `sampling_probs` gives.

A draft may be a token tree (`Draft.parents`): several continuations verified in one pass, each
row attending to its ancestors only (`LayeredModel.context(..., tree_parents)`). Its tokens are
fixed choices (no draft distribution), so acceptance draws the model's token at the root as
plain decoding would (argmax, or one draw from `sampling_probs`) and moves to the child holding
that token, until no child does: exactly plain decoding's output, or its distribution.
`commit_path` then moves the accepted rows' keys and values to consecutive cache slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.params import GenerationParams
from ..engine.sampling import greedy_index, greedy_indices, sample_index, sampling_probs


@dataclass
class Draft:
    """Proposed tokens. `probs` (k, vocab): the distribution each token was drawn from (None: a
    deterministic draft, a point mass). `hidden` (1, k+1, hidden): the hidden states after the
    first `start_layer` layers at the last emitted token and the k drafted tokens, whose keys and
    values for those layers are already in the cache, so verification resumes there (None: start
    from the embeddings)."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    start_layer: int = 0
    source: str = "draft"
    parents: list[int] | None = None  # a tree: parents[i] is the index of token i's parent, -1 the last emitted token
    accepted: list[int] | None = None  # set by verification: the indices of the accepted tokens, in order
    rates: list[float] | None = None  # each token's estimated acceptance given the ones before it

    def trim(self, k: int) -> None:
        """Keep the chain's first k tokens: what a shared verify budget scored of it."""
        if self.parents is not None or self.hidden is not None:
            raise ValueError("only a chain drafted as token ids can be trimmed")
        self.tokens = self.tokens[:k]
        self.probs = None if self.probs is None else self.probs[:k]
        self.rates = None if self.rates is None else self.rates[:k]

    def rows(self) -> list[int] | None:
        """The verification pass's row tree (row 0: the last emitted token), None for a chain."""
        return None if self.parents is None else [-1] + [p + 1 for p in self.parents]

    def depths(self) -> list[int]:
        """Depth of each drafted token (1: a child of the last emitted token)."""
        if self.parents is None:
            return list(range(1, len(self.tokens) + 1))
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth


def score(model, cache, last_token: int, draft: Draft, position: int) -> torch.Tensor:
    """Float32 logits (k+1, vocab) at positions position..position+k, where `last_token` sits at
    `position`: row i predicts the token after draft[:i]. Appends those positions to the cache.
    A chain of token ids goes through `model.score_chain`, where a batched model's shared verify
    budget may score fewer rows: the caller trims the draft to len(logits) - 1 tokens."""
    if draft.parents is None and draft.hidden is None:
        return model.score_chain([last_token] + draft.tokens, cache, position, draft.rates)
    k = len(draft.tokens)
    if draft.parents is not None:
        if draft.hidden is not None:
            raise ValueError("a token tree is verified from the embeddings (no drafted hidden states)")
        positions = torch.tensor([position] + [position + d for d in draft.depths()], device=model.device)
        ctx = model.context(positions, tree_parents=draft.rows())
    else:
        ctx = model.context(torch.arange(position, position + k + 1, device=model.device))
    if draft.hidden is None:
        hidden = model.embed(torch.tensor([last_token] + draft.tokens, device=model.device), ctx)
        start = 0
    else:
        hidden, start = draft.hidden, draft.start_layer
    hidden = model.run_layers(start, hidden, ctx, cache)
    return model.logits(hidden)[0]


def accept_greedy(logits: torch.Tensor, tokens: list[int]) -> tuple[int, int]:
    """(number of drafted tokens accepted, the model's own next token after them)."""
    choice = greedy_indices(logits)
    n = 0
    while n < len(tokens) and tokens[n] == choice[n]:
        n += 1
    return n, choice[n]


def accept_sampled(
    logits: torch.Tensor,
    tokens: list[int],
    draft_probs: torch.Tensor | None,
    params: GenerationParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling: (accepted count, next token: the residual draw or the bonus draw)."""
    for i, token in enumerate(tokens):
        p = sampling_probs(logits[i], params)
        q_token = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if float(torch.rand((), generator=generator, device=p.device)) * q_token < float(p[token]):
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[token] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: nothing to correct
            residual = p
        return i, sample_index(residual, generator)
    bonus = sampling_probs(logits[len(tokens)], params)
    return len(tokens), sample_index(bonus, generator)


def accept_tree(logits: torch.Tensor, draft: Draft, params: GenerationParams,
                generator: torch.Generator | None) -> tuple[list[int], int]:
    """(the accepted drafted tokens' indices, root to leaf; the model's own next token after them)."""
    if draft.probs is not None:
        raise ValueError("token trees hold fixed choices: a sampled draft (with probabilities) is verified as a chain")
    children: dict[tuple[int, int], int] = {}
    for i, (token, parent) in enumerate(zip(draft.tokens, draft.parents)):
        children.setdefault((parent + 1, token), i)
    path, row = [], 0
    while True:
        token = (greedy_index(logits[row]) if params.temperature == 0
                 else sample_index(sampling_probs(logits[row], params), generator))
        child = children.get((row, token))
        if child is None:
            return path, token
        path.append(child)
        row = child + 1


def accept(logits, draft: Draft, params: GenerationParams, generator) -> tuple[int, int]:
    if params.temperature == 0:
        return accept_greedy(logits, draft.tokens)
    return accept_sampled(logits, draft.tokens, draft.probs, params, generator)


def commit_path(cache, position: int, path: list[int]) -> None:
    """After a tree pass: the accepted tokens' keys and values (drafted token i sits in slot
    position + 1 + i) move to slots position + 1, position + 2, ...; the cache then ends there."""
    for j, i in enumerate(path):
        if i != j:
            cache.move(position + 1 + i, position + 1 + j)
    cache.crop(position + 1 + len(path))
