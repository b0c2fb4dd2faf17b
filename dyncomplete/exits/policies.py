"""Exit policies: at an exit layer, decide from the hidden state (and maybe the head's logits)
whether the current token stops there.

Each policy has one threshold (`early-exit:confidence@0.9`). Comparisons are
strict, so the strictest threshold (1.0 for confidence, margin and saturation, 0 for entropy,
L for static) never exits and reproduces the full model exactly.

Policies with `needs_logits` make the decoder run the exit head at every exit layer it checks
(a full LM-head evaluation each, counted in `head_evals`); the others decide from the hidden
state and the head runs once, where the token exits. `decision_macs()` is the policy's own work
per check, beyond any head evaluation.
"""

from __future__ import annotations

import importlib

import torch

# Every policy: name -> the module whose `build(name, threshold, model, heads)` makes it (imported
# when used: the trained ones load weights). Adding a policy is one module plus one line here.
POLICIES: dict[str, str] = {
    "static": "dyncomplete.exits.policies",
    "confidence": "dyncomplete.exits.policies",
    "entropy": "dyncomplete.exits.policies",
    "margin": "dyncomplete.exits.policies",
    "saturation": "dyncomplete.exits.policies",
    "classifier": "dyncomplete.exits.classifier",
    "rl": "dyncomplete.exits.agent",
}


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


def make_policy(name: str, threshold: float, model, heads) -> ExitPolicy:
    """The policy `name` at `threshold` for this model and these heads."""
    if name not in POLICIES:
        raise ValueError(f"unknown exit policy {name!r}: known are {', '.join(POLICIES)}")
    return importlib.import_module(POLICIES[name]).build(name, float(threshold), model, heads)


def build(name: str, threshold: float, model, heads) -> ExitPolicy:
    if name == "saturation":
        return Saturation(threshold, model.hidden_size)
    return {"static": Static, "confidence": Confidence, "entropy": Entropy, "margin": Margin}[name](threshold)
