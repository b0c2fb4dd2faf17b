"""The reward of GREEN-CODE's Eq. 2, one decision at a time.

The optimal exit l* of a token is the first exit layer whose prediction equals the target (the
final layer's prediction, or the ground-truth token with `--target ground-truth`); the final
layer L stands for "no exit layer is right". Each decision at exit layer l is judged on its own:

    exit,     l == l*  ->  +alpha          continue, l <  l*  ->  +alpha
    exit,     l <  l*  ->  -beta  * (l* - l)      (too early)
    exit,     l >  l*  ->  -gamma * (l - l*)      (too late)
    continue, l >= l*  ->  -gamma * (l' - l*)     (too late: carries the token to l', the next
                                                   exit layer or L)

Distances are in decoder layers, as in the paper. Details Eq. 2 leaves open, chosen here: a
"continue" at or past l* is a too-late decision charged by how far past l* it carries the token,
so a late exit pays both for the continue that made it late and for the exit itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...exits.agent import EXIT


@dataclass(frozen=True)
class RewardConfig:
    alpha: float = 1.0  # a right decision
    beta: float = 0.5  # per layer of exiting too early (paper: 1 for Java, 0.5 for Python)
    gamma: float = 0.5  # per layer of going too deep


def reward(action: int, layer: int, next_layer: int, optimal: int, cfg: RewardConfig) -> float:
    """Reward of `action` at exit layer `layer`; `next_layer` is where "continue" leads."""
    if action == EXIT:
        if layer == optimal:
            return cfg.alpha
        if layer < optimal:
            return -cfg.beta * (optimal - layer)
        return -cfg.gamma * (layer - optimal)
    if layer < optimal:
        return cfg.alpha
    return -cfg.gamma * (next_layer - optimal)


def optimal_exits(exit_preds: np.ndarray, target: np.ndarray, layers: list[int], num_layers: int) -> np.ndarray:
    """Per token, the first exit layer whose prediction equals `target`, else `num_layers`.

    exit_preds: (tokens, exits) top-1 ids at `layers`; target: (tokens,) ids."""
    hit = exit_preds == target[:, None]
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), len(layers))
    return np.asarray(list(layers) + [num_layers])[first]
