"""The one place a token is drawn from logits: greedy at temperature 0, else temperature +
nucleus (top-p). `sampling_probs` is also the distribution speculative sampling must preserve."""

from __future__ import annotations

import time

import torch

from .params import GenerationParams


def sampling_probs(logits: torch.Tensor, params: GenerationParams) -> torch.Tensor:
    """The distribution a token is drawn from, on the logits' device."""
    probs = torch.softmax(logits.reshape(-1).float() / max(params.temperature, 1e-6), dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def greedy_indices(logits: torch.Tensor) -> list[int]:
    """Each row's greedy token (logits (..., vocab)): the first index of its largest value, as
    torch.argmax gives it. NumPy's argmax on CPU floats is vectorised where torch's is not, and
    over a 150k-token vocabulary torch's was a visible share of a small model's decode step."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(axis=-1).reshape(-1).tolist()
    return torch.argmax(logits, dim=-1).reshape(-1).tolist()


def greedy_index(logits: torch.Tensor) -> int:
    """The greedy token of one position's logits (any shape holding one vocabulary)."""
    return greedy_indices(logits.reshape(1, -1))[0]


def sample_index(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One index drawn with probability proportional to `weights` (1-D, nonnegative): one uniform
    number against the float64 cumulative sum of the nonzero weights. torch.multinomial draws one
    random number per entry instead: over Qwen's 151,936-token vocabulary, a sizeable share of a
    decode step (docs/results.md, "A sampled token's draw")."""
    nonzero = torch.nonzero(weights).reshape(-1)
    cumulative = torch.cumsum(weights[nonzero].double(), dim=0)
    u = torch.rand((), generator=generator, device=weights.device, dtype=torch.float64) * cumulative[-1]
    at = min(int(torch.searchsorted(cumulative, u, right=True)), len(nonzero) - 1)
    return int(nonzero[at])


def draw(logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None
         ) -> tuple[int, torch.Tensor | None]:
    """(the token, the distribution it was drawn from; None when greedy)."""
    if params.temperature == 0:
        return greedy_index(logits), None
    probs = sampling_probs(logits, params)
    return sample_index(probs, generator), probs


def choose_token(logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None) -> int:
    return draw(logits, params, generator)[0]


def make_generator(params: GenerationParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A seeded random stream on the device the logits live on (None when greedy)."""
    if params.temperature == 0:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % (2**31)))
    return gen
