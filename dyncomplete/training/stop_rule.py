"""Training of the stop rule (`exits.stop_rule`): teacher-forced on the train split, a token is
wrong where the model's top-1 differs from the real code's next token."""

from __future__ import annotations

from pathlib import Path

import torch

from ..exits import artefacts
from ..exits.classifier import WIDTH
from .classifier import fit_mlp
from .collect import CHUNK, SKIP, Collected


def wrong_labels(data: Collected, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices, is-wrong) for every position whose next real token is in the data."""
    per_chunk = chunk - SKIP
    idx = torch.arange(len(data))
    idx = idx[(idx + 1) % per_chunk != 0]
    return idx, data.top_ids[idx, 0] != data.input_ids[idx + 1]


def train_stop_rule(data: Collected, steps: int = 400, batch: int = 512, seed: int = 0,
                    chunk: int = CHUNK) -> torch.nn.Module:
    idx, wrong = wrong_labels(data, chunk)
    with torch.random.fork_rng():  # seeded, without moving the caller's random stream
        torch.manual_seed(seed)
        return fit_mlp(data.final_normed[idx].float(), wrong.float(), steps, batch)


def save_stop_rule(model, mlp, path: Path, meta: dict) -> Path:
    return artefacts.save_artefact(path, mlp.state_dict(), {**artefacts.model_record(model), "width": WIDTH, **meta})
