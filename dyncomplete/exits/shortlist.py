"""A shortlist head: the LM head's rows for the most frequent tokens only, in the head's own
weight format (int4 rows where the model runs int4).

An exit decision and a self-draft need the top of the distribution, not all of it, and the full
head is the costly part of a small model (SmolLM2: 49,152 rows, about eight layers of work). The
lowest BPE ids are the earliest merges, the most frequent pieces of the tokenizer's training
text, so the first `size` ids stand in for a frequency-ranked vocabulary (FR-Spec's idea).

Code is full of rare identifier tokens that the request's own text holds, so each request adds
the tokens of its context (`Shortlist.for_request`, as the self-drafter always did).

Softmax over the shortlist only can overstate confidence and margin (the denominator misses the
other rows), never understate them while the top token is in the list; so an exit that the
shortlist allows is confirmed with the full head (`EarlyExit`), and one it refuses would have
been refused by the full head too unless the full head's top token is in neither list.
"""

from __future__ import annotations

import torch

DEFAULT_SIZE = 4096


def softcapped(model, logits: torch.Tensor) -> torch.Tensor:
    """The model's final logit soft-capping (Gemma), as its head applies it."""
    return logits if model.softcap is None else torch.tanh(logits / model.softcap) * model.softcap


class Shortlist:
    def __init__(self, model, size: int = DEFAULT_SIZE):
        from ..models.weights import Linear

        if size < 2:
            raise ValueError(f"a shortlist needs at least 2 rows, got {size}")
        self.model = model
        self.size = min(size, model.vocab_size)
        weight = model.lm_head.weight[: self.size]
        bias = model.lm_head.bias[: self.size] if model.lm_head.bias is not None else None
        # the full head's rows as the model multiplies by them (dequantized where quantized),
        # quantized again the same way: int4 levels of int4 values come back nearly unchanged
        self.linear = Linear(weight.detach().clone(), bias, model.quant)  # quantized only on the fast engine
        self.linear.levels = None  # only `dequantized` reads them

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Float logits of the shortlist's rows (ids 0..size-1) for a normed hidden state (..., d)."""
        logits = self.linear(normed.reshape(-1, self.model.hidden_size)).float()
        return softcapped(self.model, logits).reshape(*normed.shape[:-1], self.size)

    def macs(self) -> float:
        return float(self.size * self.model.hidden_size)

    def for_request(self) -> "RequestShortlist":
        return RequestShortlist(self)


class RequestShortlist:
    """A shortlist plus the tokens one request's context holds beyond it (their rows as the model
    multiplies by them, in float32). `ids[i]` is the token of logit i."""

    def __init__(self, base: Shortlist):
        self.base = base
        self.ids = list(range(base.size))
        self.added: set[int] = set()  # ids[base.size:], for lookups
        self.rows = base.model.lm_head.weight[:0].float()  # float32: see `exits.heads.load_heads`
        self.seen = 0

    def grow(self, context: list[int]) -> None:
        """Add the tokens of `context` that arrived since the last call."""
        vocab = self.base.model.vocab_size
        new = [t for t in dict.fromkeys(context[self.seen :]) if self.base.size <= t < vocab and t not in self.added]
        self.seen = len(context)
        if new:
            self.ids.extend(new)
            self.added.update(new)
            self.rows = torch.cat([self.rows, self.base.model.lm_head.weight[new].float()])

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Float logits over `ids` for one normed hidden state (d,)."""
        logits = self.base.logits(normed.reshape(-1))
        if not len(self.rows):
            return logits
        return torch.cat([logits, softcapped(self.base.model, normed.reshape(-1).float() @ self.rows.T)])

    def macs(self) -> float:
        return float(len(self.ids) * self.base.model.hidden_size)
