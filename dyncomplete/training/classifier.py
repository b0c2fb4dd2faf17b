"""Training of the ICSE 2024 exit classifier (`exits.classifier`) and the MLP fit it shares with
the stop rule.

Training labels come from the cached train-split hidden states; the exit head's top-1 is taken
over a shortlist (the frequent tokens plus the teacher's top-16 of that position) instead of the
full vocabulary, which keeps labelling cheap on a CPU; calibration then measures agreement with
the full head, so the shortlist only affects how well the classifier ranks tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from ..exits import artefacts
from ..exits.classifier import WIDTH, features, new_mlp
from ..exits.heads import ExitHeads
from .collect import Collected
from .translators import shortlist_base


@torch.inference_mode()
def shortlist_labels(heads: ExitHeads, data: Collected, base_vocab: int = 768, batch: int = 1024) -> dict[int, torch.Tensor]:
    """Per exit layer: does the head's top-1 over (frequent tokens + teacher top-16) equal the
    final layer's top-1?"""
    weight = heads.model.lm_head.weight
    base = shortlist_base(data, base_vocab)
    labels = {}
    for e in heads.layers:
        out = []
        for s in range(0, len(data), batch):
            normed = heads.normed(e, data.hidden[e][s : s + batch].to(heads.model.dtype))
            top = data.top_ids[s : s + batch]
            cand = torch.cat([base[None].expand(len(top), -1), top], 1)
            logits = torch.cat([normed @ weight[base].T, torch.einsum("nd,nkd->nk", normed, weight[top])], 1)
            out.append(cand.gather(1, logits.argmax(1, keepdim=True))[:, 0] == top[:, 0])
        labels[e] = torch.cat(out)
    return labels


def train_classifier(heads: ExitHeads, data: Collected, steps: int = 300, batch: int = 512, seed: int = 0,
                     progress: bool = True) -> dict[int, torch.nn.Module]:
    labels = shortlist_labels(heads, data)
    mlps = {}
    with torch.random.fork_rng():  # seeded, without moving the caller's random stream
        torch.manual_seed(seed)
        for e in tqdm(heads.layers, desc="train classifiers", disable=not progress):
            with torch.inference_mode():
                x = features(heads.model, data.hidden[e].to(heads.model.dtype)).clone()
            mlps[e] = fit_mlp(x, labels[e].float(), steps, batch)
    return mlps


def fit_mlp(x: torch.Tensor, y: torch.Tensor, steps: int, batch: int) -> torch.nn.Module:
    """A binary classifier on rows of x (logistic loss, Adam on random mini-batches)."""
    mlp = new_mlp(x.shape[1])
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(steps):
        idx = torch.randint(len(y), (batch,))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(mlp(x[idx])[:, 0], y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return mlp.requires_grad_(False)


def save_classifier(model, mlps, path: Path, meta: dict) -> Path:
    tensors = {f"{e}.{k}": v for e, m in mlps.items() for k, v in m.state_dict().items()}
    record = {**artefacts.model_record(model), "layers": sorted(mlps), "width": WIDTH, **meta}
    return artefacts.save_artefact(path, tensors, record)
