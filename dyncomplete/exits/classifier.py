"""The ICSE 2024 exit decision: a small per-layer classifier on the hidden state that predicts
whether this layer's token equals the final layer's. It decides without any head evaluation
(about 1% of a layer's work), so the LM head runs once, where the token exits.

Training labels come from the cached train-split hidden states; the exit head's top-1 is taken
over a shortlist (the frequent tokens plus the teacher's top-16 of that position) instead of the
full vocabulary, which keeps labelling cheap on a CPU; calibration then measures agreement with
the full head, so the shortlist only affects how well the classifier ranks tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from .collect import Collected
from .heads import ExitHeads, default_path, read_record
from .policies import ExitPolicy, register_policy
from .train import shortlist_base

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

    @torch.no_grad()
    def scores(self, e: int, hidden: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.mlps[e](features(self.model, hidden))).reshape(hidden.shape[:-1])

    def decide(self, e, hidden, logits):
        return e in self.mlps and float(self.scores(e, hidden)) > self.threshold

    def decision_macs(self):
        return float(self.model.hidden_size * (WIDTH + 1) + WIDTH)


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
    torch.manual_seed(seed)
    labels = shortlist_labels(heads, data)
    mlps = {}
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
    tensors = {f"{e}.{k}": v.float().contiguous() for e, m in mlps.items() for k, v in m.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    record = {"model": model.name, "model_sha256": model.source_sha256, "layers": sorted(mlps), "width": WIDTH, **meta}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return path


def load_classifier(model, path: Path | None = None) -> dict[int, torch.nn.Module]:
    path = Path(path) if path else default_path(model).with_name(CLASSIFIER_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"no exit classifier at {path}: run `dyncomplete train-classifier`")
    meta = read_record(path, model, "exit classifier")
    tensors = load_file(str(path))
    mlps = {}
    for e in meta["layers"]:
        mlp = new_mlp(model.hidden_size)
        mlp.load_state_dict({k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == str(e)})
        mlps[e] = mlp.requires_grad_(False)
    return mlps


register_policy("classifier", lambda t, model, heads: Classifier(t, model, load_classifier(model)))
