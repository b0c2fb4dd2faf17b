"""Exit policies: at an exit layer, decide from the hidden state (and maybe the head's logits)
whether the current token stops there.

Each policy has one threshold; names are `POLICY@THRESHOLD` (`confidence@0.9`). Comparisons are
strict, so the strictest threshold (1.0 for confidence, margin and saturation, 0 for entropy,
L for static) never exits and reproduces the full model exactly.

Policies with `needs_logits` make the decoder run the exit head at every exit layer it checks
(a full LM-head evaluation each, counted in `head_evals`); the others decide from the hidden
state and the head runs once, where the token exits. `decision_macs()` is the policy's own work
per check, beyond any head evaluation.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

PolicyFactory = Callable[[float, object, object], "ExitPolicy"]  # (threshold, model, heads)

_POLICIES: dict[str, PolicyFactory] = {}

# Modules that register more policies when imported (lazily: they may load trained weights).
POLICY_PLUGINS: list[str] = ["dyncomplete.exits.classifier", "dyncomplete.exits.rl.policy"]


class ExitPolicy:
    needs_logits = False

    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    def decide(self, e: int, hidden: torch.Tensor, logits: torch.Tensor | None) -> bool:
        raise NotImplementedError

    def decision_macs(self) -> float:
        return 0.0

    def reset(self) -> None:
        """Forget per-token state; called before each token's layers run."""


class Static(ExitPolicy):
    """Exit at the first exit layer >= the threshold (a layer number)."""

    def decide(self, e, hidden, logits):
        return e >= self.threshold


class Confidence(ExitPolicy):
    """Exit when the top probability exceeds the threshold."""

    needs_logits = True

    def decide(self, e, hidden, logits):
        return float(torch.softmax(logits.float(), -1).max()) > self.threshold


class Entropy(ExitPolicy):
    """Exit when the entropy (nats) of the exit distribution is below the threshold."""

    needs_logits = True

    def decide(self, e, hidden, logits):
        logp = torch.log_softmax(logits.float(), -1)
        return float(-(logp.exp() * logp).sum()) < self.threshold


class Margin(ExitPolicy):
    """Exit when top-1 minus top-2 probability exceeds the threshold."""

    needs_logits = True

    def decide(self, e, hidden, logits):
        top = torch.softmax(logits.float(), -1).topk(2).values
        return float(top[0] - top[1]) > self.threshold


class Saturation(ExitPolicy):
    """Exit when the hidden state barely changed since the previous exit layer checked (cosine
    similarity above the threshold): no head needed to decide."""

    def __init__(self, threshold, hidden_size: int):
        super().__init__(threshold)
        self.hidden_size = hidden_size
        self.previous: torch.Tensor | None = None

    def reset(self):
        self.previous = None

    def decide(self, e, hidden, logits):
        h = hidden.reshape(-1).float()
        prev, self.previous = self.previous, h
        if prev is None:
            return False
        return float(torch.nn.functional.cosine_similarity(h, prev, dim=0)) > self.threshold

    def decision_macs(self):
        return 3.0 * self.hidden_size


def register_policy(name: str, factory: PolicyFactory) -> None:
    _POLICIES[name] = factory


def policy_names() -> list[str]:
    for module in POLICY_PLUGINS:
        importlib.import_module(module)
    return sorted(_POLICIES)


def make_policy(spec: str, model, heads) -> ExitPolicy:
    """`NAME@THRESHOLD` -> a policy for this model and these heads."""
    name, sep, value = spec.partition("@")
    known = policy_names()
    if name not in known:
        raise ValueError(f"unknown exit policy {name!r}: known are {', '.join(known)}")
    if not sep:
        raise ValueError(f"exit policy {spec!r} needs a threshold: {name}@T")
    try:
        threshold = float(value)
    except ValueError:
        raise ValueError(f"bad threshold {value!r} in {spec!r}") from None
    return _POLICIES[name](threshold, model, heads)


register_policy("static", lambda t, model, heads: Static(t))
register_policy("confidence", lambda t, model, heads: Confidence(t))
register_policy("entropy", lambda t, model, heads: Entropy(t))
register_policy("margin", lambda t, model, heads: Margin(t))
register_policy("saturation", lambda t, model, heads: Saturation(t, model.hidden_size))
