"""Verification of a draft: score it with the full model in one pass, then accept or reject.

`score` runs the model over the last emitted token and the drafted tokens at once, starting from
the layer the draft reached (0 for drafts given as token ids, the exit layer for self-drafts whose
shallow layers already ran). Greedy acceptance keeps the longest prefix that agrees with the
model's argmax; at temperature > 0 speculative sampling (Leviathan et al. 2023, Chen et al. 2023)
accepts a drafted token x with probability min(1, p(x) / q(x)) and on rejection draws from the
residual max(0, p - q), so every emitted token has exactly the distribution `sampling_probs` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.params import GenerationParams
from ..engine.sampling import sampling_probs


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


def score(model, cache, last_token: int, draft: Draft, position: int) -> torch.Tensor:
    """Float32 logits (k+1, vocab) at positions position..position+k, where `last_token` sits at
    `position`: row i predicts the token after draft[:i]. Appends those positions to the cache."""
    k = len(draft.tokens)
    ctx = model.context(torch.arange(position, position + k + 1, device=model.device))
    if draft.hidden is None:
        hidden = model.embed(torch.tensor([last_token] + draft.tokens, device=model.device), ctx)
        start = 0
    else:
        hidden, start = draft.hidden, draft.start_layer
    hidden = model.run_layers(start, hidden, ctx, cache)
    return model.head(model.final_norm(hidden))[0].float()


def accept_greedy(logits: torch.Tensor, tokens: list[int]) -> tuple[int, int]:
    """(number of drafted tokens accepted, the model's own next token after them)."""
    choice = torch.argmax(logits, dim=-1).tolist()
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
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    bonus = sampling_probs(logits[len(tokens)], params)
    return len(tokens), int(torch.multinomial(bonus, 1, generator=generator))


def accept(logits, draft: Draft, params: GenerationParams, generator) -> tuple[int, int]:
    if params.temperature == 0:
        return accept_greedy(logits, draft.tokens)
    return accept_sampled(logits, draft.tokens, draft.probs, params, generator)
