"""Exit policies: at an exit layer, decide from the hidden state (and maybe the head's logits)
whether the current token stops there.

Each policy is one class with `scores(e, hidden, logits)`: a score per token (rows of hidden
states, and of logits for a policy with `needs_logits`), and `fires(score, threshold)`: whether a
score exits at the policy's one threshold (`early-exit:confidence@0.9`; strictly above it unless
the class says otherwise). Decoding (`decide`, one token) and calibration
(`training/calibrate.py`, every token of the calib split at once) both go through these two, so
they cannot disagree. A layer where a policy cannot exit scores -inf (saturation's first check,
a layer without a trained classifier). Comparisons are strict, so the strictest threshold (1.0
for confidence, margin and saturation, 0 for entropy, L for static) never exits and reproduces
the full model exactly.

Policies with `needs_logits` make the decoder run the exit head at every exit layer it checks
(a full LM-head evaluation each, counted in `head_evals`); the others decide from the hidden
state and the head runs once, where the token exits. `decision_macs()` is the policy's own work
per check, beyond any head evaluation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the commands read POLICIES without importing the models
    from ..models.native.bindings import ExitNetwork

# Every policy: name -> "module:class" (imported when used: the trained ones load weights).
# Adding a policy is one class plus one line here.
POLICIES: dict[str, str] = {
    "static": "dyncomplete.exits.policies:Static",
    "confidence": "dyncomplete.exits.policies:Confidence",
    "entropy": "dyncomplete.exits.policies:Entropy",
    "margin": "dyncomplete.exits.policies:Margin",
    "saturation": "dyncomplete.exits.policies:Saturation",
    "classifier": "dyncomplete.exits.classifier:Classifier",
    "rl": "dyncomplete.exits.agent:RLPolicy",
}


class ExitPolicy:
    needs_logits = False

    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    @classmethod
    def build(cls, threshold: float, model, heads) -> "ExitPolicy":
        """The policy at `threshold` for this model and these heads (override to load what it needs)."""
        return cls(threshold)

    def scores(self, e: int, hidden: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """The score of each token at exit layer `e`: hidden (..., d), logits (..., V) or None."""
        raise NotImplementedError

    @staticmethod
    def fires(score, threshold: float):
        """Whether a score (a float, or a tensor of them) exits at `threshold`."""
        return score > threshold

    def decide(self, e: int, hidden: torch.Tensor, logits: torch.Tensor | None) -> bool:
        return bool(self.fires(float(self.scores(e, hidden, logits)), self.threshold))

    def decision_macs(self) -> float:
        return 0.0

    def networks(self, layers: list[int]) -> dict[int, ExitNetwork | None] | None:
        """The policy as decode.c decides it at these exit layers (`native.bindings.Exits`): the
        layers it may exit at, each with its network (None: exit there without deciding); None
        where it needs the head's logits or state along a token, and decides in Python."""
        return None

    def reset(self) -> None:
        """Forget per-token state; called before each token's layers run."""


class Static(ExitPolicy):
    """Exit at the first exit layer >= the threshold (a layer number)."""

    def scores(self, e, hidden, logits):
        return torch.full(hidden.shape[:-1], float(e))

    @staticmethod
    def fires(score, threshold):
        return score >= threshold

    def networks(self, layers):
        reached = [e for e in layers if e >= self.threshold]
        return {reached[0]: None} if reached else {}


class Confidence(ExitPolicy):
    """Exit when the top probability exceeds the threshold."""

    needs_logits = True

    def scores(self, e, hidden, logits):
        return torch.softmax(logits.float(), -1).amax(-1)


class Entropy(ExitPolicy):
    """Exit when the entropy (nats) of the exit distribution is below the threshold."""

    needs_logits = True

    def scores(self, e, hidden, logits):
        logp = torch.log_softmax(logits.float(), -1)
        return -(logp.exp() * logp).sum(-1)

    @staticmethod
    def fires(score, threshold):
        return score < threshold


class Margin(ExitPolicy):
    """Exit when top-1 minus top-2 probability exceeds the threshold."""

    needs_logits = True

    def scores(self, e, hidden, logits):
        top = torch.softmax(logits.float(), -1).topk(2).values
        return top[..., 0] - top[..., 1]


class Saturation(ExitPolicy):
    """Exit when the hidden state barely changed since the previous exit layer checked (cosine
    similarity above the threshold): no head needed to decide. The first check has nothing to
    compare with and scores -inf."""

    def __init__(self, threshold, hidden_size: int):
        super().__init__(threshold)
        self.hidden_size = hidden_size
        self.previous: torch.Tensor | None = None

    @classmethod
    def build(cls, threshold, model, heads):
        return cls(threshold, model.hidden_size)

    def reset(self):
        self.previous = None

    def scores(self, e, hidden, logits):
        h = hidden.float()
        prev, self.previous = self.previous, h
        if prev is None:
            return torch.full(h.shape[:-1], -torch.inf)
        return torch.nn.functional.cosine_similarity(h, prev, dim=-1)

    def decision_macs(self):
        return 3.0 * self.hidden_size


def policy_class(name: str) -> type[ExitPolicy]:
    """The class of the policy `name` in `POLICIES`."""
    if name not in POLICIES:
        raise ValueError(f"unknown exit policy {name!r}: known are {', '.join(POLICIES)}")
    module, _, cls = POLICIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_policy(name: str, threshold: float, model, heads) -> ExitPolicy:
    """The policy `name` at `threshold` for this model and these heads."""
    return policy_class(name).build(float(threshold), model, heads)
