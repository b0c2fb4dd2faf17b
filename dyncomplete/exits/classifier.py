"""The ICSE 2024 exit decision: a small per-layer classifier on the hidden state that predicts
whether this layer's token equals the final layer's. It decides without any head evaluation
(about 1% of a layer's work), so the LM head runs once, where the token exits.

Trained by `training.classifier`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.native.bindings import ExitNetwork
from . import artefacts
from .policies import ExitPolicy

CLASSIFIER_FILE = "exit_classifier.safetensors"
WIDTH = 64


def new_mlp(hidden_size: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(hidden_size, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))


def features(model, hidden: torch.Tensor) -> torch.Tensor:
    """The final norm of the raw hidden state: scale-free and a few thousand MACs."""
    return model.final_norm(hidden).float()


class Classifier(ExitPolicy):
    """Exit when the predicted probability that the exit token is right exceeds the threshold."""

    def __init__(self, threshold, model, mlps: dict[int, torch.nn.Module]):
        super().__init__(threshold)
        self.model, self.mlps = model, mlps

    @classmethod
    def build(cls, threshold, model, heads):
        return cls(threshold, model, load_classifier(model))

    @torch.no_grad()
    def scores(self, e: int, hidden: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        if e not in self.mlps:  # a layer it was not trained for never exits
            return torch.full(hidden.shape[:-1], -torch.inf)
        return torch.sigmoid(self.mlps[e](features(self.model, hidden))).reshape(hidden.shape[:-1])

    def decision_macs(self):
        return float(self.model.hidden_size * (WIDTH + 1) + WIDTH)

    def networks(self, layers):
        dense = lambda mlp: [(lin.weight, lin.bias) for lin in mlp if isinstance(lin, torch.nn.Linear)]
        return {e: ExitNetwork("final_norm", "relu", dense(self.mlps[e])) for e in layers if e in self.mlps}


def load_classifier(model, path: Path | None = None) -> dict[int, torch.nn.Module]:
    path = Path(path) if path else artefacts.default_path(model, CLASSIFIER_FILE)
    tensors, meta = artefacts.load_artefact(path, model, "exit classifier", "run `dyncomplete train-classifier`")
    mlps = {}
    for e in meta["layers"]:
        mlp = new_mlp(model.hidden_size)
        mlp.load_state_dict({k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == str(e)})
        mlps[e] = mlp.requires_grad_(False)
    return mlps
