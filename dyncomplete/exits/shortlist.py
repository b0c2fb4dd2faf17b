"""A shortlist head: the LM head's rows for the most frequent tokens only, in the head's own
weight format (int4 rows where the model runs int4).

An exit decision and a self-draft need the top of the distribution, not all of it, and the full
head is the costly part of a small model (SmolLM2: 49,152 rows, about eight layers of work).
The rows are the model's tokens ranked by how often the train split's code uses them (FR-Spec's
frequency-ranked vocabulary), from the `token_ranks` artefact that `dyncomplete rank-tokens`
writes and the package ships; then, for a model without one, the lowest BPE ids (the earliest
merges, the most frequent pieces of the tokenizer's own training text).

Code is full of rare identifier tokens that the request's own text holds, so each request adds
the tokens of its context (`Shortlist.for_request`, as the self-drafter always did). The model's
end-of-generation tokens are always rows too: source files never hold them, and without them a
token chosen from the shortlist alone could never end a completion (a tuned model ends a middle
with `<|endoftext|>`).

Softmax over the shortlist only can overstate confidence and margin (the denominator misses the
other rows), never understate them while the top token is in the list; so an exit that the
shortlist allows is confirmed with the full head (`EarlyExit`), and one it refuses would have
been refused by the full head too unless the full head's top token is in neither list. With
`emit=short` there is no full head at an exit: the token is the shortlist's (`spread`).
"""

from __future__ import annotations

import collections
import itertools
from pathlib import Path

import torch

from ..models.end_tokens import eos_ids_of
from . import artefacts

DEFAULT_SIZE = 4096  # rows to decide on
EMIT_SIZE = 32768  # rows to choose an exited token from (`emit=short`): it has no full head to fall back on
RANKS_FILE = "token_ranks.safetensors"


def rank_tokens(encode, files) -> tuple[list[int], int]:
    """The token ids that `encode` (text -> ids) gives `files`, most frequent first (ties: lower
    id first), and the number of tokens counted."""
    counts: collections.Counter[int] = collections.Counter()
    for path in files:
        counts.update(encode(Path(path).read_text(encoding="utf-8", errors="replace")))
    return sorted(counts, key=lambda t: (-counts[t], t)), sum(counts.values())


def save_ranks(model, ranked: list[int], record: dict, path: Path | None = None) -> Path:
    tensors = {"ids": torch.tensor(ranked, dtype=torch.float32)}  # exact: ids < 2**24
    return artefacts.save_artefact(path or artefacts.default_path(model, RANKS_FILE), tensors,
                                   {**artefacts.model_record(model), "tokens": len(ranked), **record})


def shortlist_ids(model, size: int) -> list[int]:
    """The `size` ids a shortlist holds: the shipped frequency ranking, then the lowest ids."""
    path = artefacts.default_path(model, RANKS_FILE)
    ranked = []
    if path.is_file():
        tensors, _ = artefacts.load_artefact(path, model, "token ranks")
        ranked = [int(t) for t in tensors["ids"][:size].tolist() if int(t) < model.vocab_size]
    chosen = set(ranked)
    rest = (t for t in range(model.vocab_size) if t not in chosen)
    return ranked + list(itertools.islice(rest, max(0, size - len(ranked))))


def softcapped(model, logits: torch.Tensor) -> torch.Tensor:
    """The model's final logit soft-capping (Gemma), as its head applies it."""
    return logits if model.softcap is None else torch.tanh(logits / model.softcap) * model.softcap


class Shortlist:
    def __init__(self, model, size: int = DEFAULT_SIZE):
        from ..models.weights import Linear

        if size < 2:
            raise ValueError(f"a shortlist needs at least 2 rows, got {size}")
        self.model = model
        ranked = shortlist_ids(model, min(size, model.vocab_size))
        self.ids = ranked + sorted(t for t in eos_ids_of(model) - set(ranked) if t < model.vocab_size)
        self.size = len(self.ids)
        self.members = set(self.ids)
        self.index = torch.tensor(self.ids)
        weight = model.lm_head.weight[self.index]
        bias = model.lm_head.bias[self.index] if model.lm_head.bias is not None else None
        # the full head's rows as the model multiplies by them (dequantized where quantized),
        # quantized again the same way: int4 levels of int4 values come back nearly unchanged
        self.linear = Linear(weight.detach().clone(), bias, model.quant)  # quantized only on the fast engine
        self.linear.levels = None  # only `dequantized` reads them

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Float logits of the shortlist's rows (token `ids[i]` at i) for a normed hidden state (..., d)."""
        logits = self.linear(normed.reshape(-1, self.model.hidden_size)).float()
        return softcapped(self.model, logits).reshape(*normed.shape[:-1], self.size)

    def macs(self) -> float:
        return float(self.size * self.model.hidden_size)

    def for_request(self) -> "RequestShortlist":
        return RequestShortlist(self)


class RequestShortlist:
    """A shortlist plus the tokens one request's context holds beyond it (their rows as the model
    multiplies by them, in float32). Logit i is the token `token(i)`; `index` holds them all."""

    def __init__(self, base: Shortlist):
        self.base = base
        self.added: list[int] = []  # the tokens of logits base.size.., in order
        self.added_set: set[int] = set()
        self.rows = base.model.lm_head.weight[:0].float()  # float32: see `exits.heads.load_heads`
        self.seen = 0
        self.index = base.index

    def token(self, i: int) -> int:
        return self.base.ids[i] if i < self.base.size else self.added[i - self.base.size]

    def grow(self, context: list[int]) -> None:
        """Add the tokens of `context` that arrived since the last call."""
        vocab = self.base.model.vocab_size
        new = [t for t in dict.fromkeys(context[self.seen :])
               if t < vocab and t not in self.base.members and t not in self.added_set]
        self.seen = len(context)
        if new:
            self.added.extend(new)
            self.added_set.update(new)
            self.rows = torch.cat([self.rows, self.base.model.lm_head.weight[new].float()])
            self.index = torch.cat([self.index, torch.tensor(new)])

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Float logits over `index` for one normed hidden state (d,)."""
        logits = self.base.logits(normed.reshape(-1))
        if not len(self.rows):
            return logits
        return torch.cat([logits, softcapped(self.base.model, normed.reshape(-1).float() @ self.rows.T)])

    def spread(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` over `index` placed in a row of the full head's width, -inf elsewhere: what
        sampling reads where a token is chosen from the shortlist alone (`early-exit:.../emit=short`)."""
        row = torch.full((self.base.model.lm_head.weight.shape[0],), -torch.inf, device=logits.device)
        row[self.index.to(logits.device)] = logits.float()
        return row

    def macs(self) -> float:
        return float(len(self.index) * self.base.model.hidden_size)
