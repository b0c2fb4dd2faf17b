"""Compute per emitted token, relative to one full forward pass of one token (docs/metrics.md).

One full pass = L decoder layers + one LM head. A decoder layer's multiply-accumulates per token
are about its parameter count (every weight is used once per token; attention over the context
is left out, as it is small for short completions); the head's are hidden x vocabulary.
"""

from __future__ import annotations


def layer_macs(model) -> float:
    """Multiply-accumulates of one token through one decoder layer (= its parameters)."""
    return float(sum(p.numel() for p in model.layers[0].parameters()))


def head_macs(model) -> float:
    return float(model.hidden_size * model.vocab_size)


def full_pass_macs(model) -> float:
    return model.num_layers * layer_macs(model) + head_macs(model)


def compute_per_token(stats, model) -> float:
    """(layer_evals x layer MACs + head_evals x head MACs + extra_macs) / new tokens / full pass.
    Full-depth decoding scores 1.0; 0 when nothing was emitted."""
    if not stats.new_tokens:
        return 0.0
    work = stats.layer_evals * layer_macs(model) + stats.head_evals * head_macs(model) + stats.extra_macs
    return work / stats.new_tokens / full_pass_macs(model)


def decision_per_token(stats, model) -> float:
    """The part of `compute_per_token` that early exit spent deciding where to exit."""
    return stats.decision_macs / stats.new_tokens / full_pass_macs(model) if stats.new_tokens else 0.0
