"""Precomputed episodes: per token of real code, the hidden state at every exit layer, each exit
layer's top-1 prediction through the exit heads, the final layer's prediction and the true next
token. Computed once (the model and the heads are frozen) and cached, so PPO never runs the model.

Hidden states are stored RMS-normalised in float16: the agent sees them that way at run time too
(`features`), which keeps their scale, growing with depth, out of the policy's inputs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from ...exits.agent import normalise
from ...paths import cache_root
from ..collect import SKIP, Collected, cached_collect
from .reward import optimal_exits

TARGETS = ("final", "ground-truth")


@dataclass
class ExitData:
    hidden: np.ndarray  # (tokens, exits, hidden_size) float16, normalised
    exit_preds: np.ndarray  # (tokens, exits) int32
    final_preds: np.ndarray  # (tokens,) int32
    truth: np.ndarray  # (tokens,) int32, the next token of the source
    layers: list[int]
    num_layers: int

    def __len__(self) -> int:
        return len(self.truth)

    def optimal(self, target: str = "final") -> np.ndarray:
        """Optimal exit layer per token. `ground-truth`: the first layer predicting the true token;
        where no layer, the final one included, predicts it, the final layer's prediction is the
        target instead (nothing is right to aim for, so follow the full model)."""
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}: use {', '.join(TARGETS)}")
        by_final = optimal_exits(self.exit_preds, self.final_preds, self.layers, self.num_layers)
        if target == "final":
            return by_final
        by_truth = optimal_exits(self.exit_preds, self.truth, self.layers, self.num_layers)
        reachable = (self.exit_preds == self.truth[:, None]).any(1) | (self.final_preds == self.truth)
        return np.where(reachable, by_truth, by_final)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        arrays = {"hidden": self.hidden, "exit_preds": self.exit_preds, "final_preds": self.final_preds,
                  "truth": self.truth, "layers": np.asarray(self.layers + [self.num_layers], dtype=np.int32)}
        save_file(arrays, str(tmp))
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path) -> "ExitData":
        a = load_file(str(path))
        layers = a["layers"].tolist()
        return cls(a["hidden"], a["exit_preds"], a["final_preds"], a["truth"], layers[:-1], layers[-1])


def model_states(model, split: str, tokens: int, chunk: int = 384, seed: int = 1, refresh: bool = False) -> Collected:
    """One pass of the model over chunks of the split, keeping every layer 1..L-1, cached on disk:
    new heads then cost only their own evaluation. A seed other than the head trainers' draws
    mostly other code than the heads were fitted on."""
    return cached_collect(model, range(1, model.num_layers), split, tokens, chunk, seed, refresh)


def precompute(model, heads, states: Collected, chunk: int = 384, batch: int = 512) -> ExitData:
    """Each exit head over the stored hidden states of `model_states(..., chunk)`."""
    hidden, preds = [], []
    with torch.inference_mode():
        for e in heads.layers:
            h = states.hidden[e].to(model.dtype)
            hidden.append(normalise(h).half())
            preds.append(torch.cat([heads.logits(e, h[i:i + batch]).argmax(-1) for i in range(0, len(h), batch)]))
    # the next token of each position; unknown (-1) at the last position of every chunk
    truth = torch.cat([states.input_ids[1:], states.input_ids.new_full((1,), -1)])
    truth[chunk - SKIP - 1::chunk - SKIP] = -1
    return ExitData(torch.stack(hidden, 1).numpy(), torch.stack(preds, 1).int().numpy(),
                    states.top_ids[:, 0].int().numpy(), truth.int().numpy(), list(heads.layers), model.num_layers)


def heads_key(heads) -> str:
    """A short hash of what the heads compute: kind, layers and translator weights."""
    digest = hashlib.sha256(f"{heads.kind}:{heads.layers}".encode())
    for name, tensor in sorted(heads.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.float().numpy().tobytes())
    return digest.hexdigest()[:12]


def cached(model, heads, split: str, tokens: int, refresh: bool = False) -> ExitData:
    """`precompute`, memoised on disk per model weights and dtype, heads, split and size."""
    dtype = str(model.dtype).removeprefix("torch.")
    key = f"{(model.source_sha256 or model.name)[:12]}-{dtype}-{heads_key(heads)}-{split}-{tokens}"
    path = cache_root() / "rl" / f"{key}.safetensors"
    if path.is_file() and not refresh:
        return ExitData.load(path)
    data = precompute(model, heads, model_states(model, split, tokens, refresh=refresh))
    data.save(path)
    return data
