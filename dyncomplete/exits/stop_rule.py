"""The stop rule's run-time part (ICSE 2024: users almost never accept a completion continued
past a wrong token): a small classifier on the normed hidden state the LM head turned into a
token predicts that the token is wrong. Trained by `training.stop_rule`; used by the
`METHOD+stop:T` wrapper (`methods.stop_rule`)."""

from __future__ import annotations

from pathlib import Path

import torch

from . import artefacts
from .classifier import WIDTH, new_mlp

STOP_FILE = "stop_rule.safetensors"


def load_stop_rule(model, path: Path | None = None) -> torch.nn.Module:
    path = Path(path) if path else artefacts.default_path(model, STOP_FILE)
    tensors, _ = artefacts.load_artefact(path, model, "stop rule", "run `dyncomplete train-stop`")
    mlp = new_mlp(model.hidden_size)
    mlp.load_state_dict(tensors)
    return mlp.requires_grad_(False)


def check_macs(model) -> float:
    """Multiply-accumulates of one check."""
    return float(model.hidden_size * (WIDTH + 1) + WIDTH)
