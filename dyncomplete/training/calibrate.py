"""Pick a policy's threshold that keeps a target agreement with the full model.

On held-out code (the calib split, teacher-forced) every exit layer's top-1 token and the
policy's score are computed once; exiting at the first layer whose score passes the threshold
is then simulated for every candidate threshold. With catch-up the caches are exact, so a
teacher-forced simulation is what decoding does on the same text. Each policy is reduced to a
score that fires when it exceeds the threshold (entropy is negated).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..exits.heads import ExitHeads
from ..exits.policies import make_policy
from ..exits.shortlist import Shortlist
from .collect import Collected

LOGIT_SCORES = ("confidence", "entropy", "margin")


@dataclass
class LayerSignals:
    """Per exit layer (rows) and token (columns)."""

    agree: torch.Tensor  # bool: the layer's top-1 equals the final layer's
    scores: dict[str, torch.Tensor]  # policy name -> score (fires when > threshold)


def logit_scores(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top-1 ids, confidence, minus the entropy, margin) of rows of logits."""
    logp = torch.log_softmax(logits.float(), -1)
    top = logp.topk(2, dim=-1)
    probs = top.values.exp()
    return top.indices[:, 0], probs[:, 0], (logp.exp() * logp).sum(-1), probs[:, 0] - probs[:, 1]


@torch.inference_mode()
def layer_signals(heads: ExitHeads, data: Collected, batch: int = 512,
                  shortlist: Shortlist | None = None) -> LayerSignals:
    """Run every exit head once on every token (the costly part: a full LM head each). With a
    shortlist, a logit policy's score is the smaller of the shortlist's and the full head's: the
    decoder exits only where both pass (`methods/early_exit.py`)."""
    agree, conf, ent, margin = [], [], [], []
    for e in heads.layers:
        rows = [[], [], [], []]
        for s in range(0, len(data), batch):
            normed = heads.normed(e, data.hidden[e][s : s + batch].to(heads.model.dtype))
            top, *scores = logit_scores(heads.model.head(normed))
            if shortlist is not None:
                scores = [torch.minimum(a, b) for a, b in zip(scores, logit_scores(shortlist.logits(normed))[1:])]
            rows[0].append(top == data.top_ids[s : s + batch, 0])
            for row, score in zip(rows[1:], scores):
                row.append(score)
        for out, row in zip((agree, conf, ent, margin), rows):
            out.append(torch.cat(row))
    scores = {"confidence": torch.stack(conf), "entropy": torch.stack(ent), "margin": torch.stack(margin)}
    scores["saturation"] = saturation_scores(heads.layers, data)
    scores["static"] = torch.tensor(heads.layers, dtype=torch.float32)[:, None].expand(-1, len(data)) + 0.5
    return LayerSignals(torch.stack(agree), scores)


def saturation_scores(layers, data: Collected) -> torch.Tensor:
    """Cosine similarity with the previous exit layer's hidden state (-1 at the first)."""
    rows = [torch.full((len(data),), -1.0)]
    for prev, e in zip(layers, layers[1:]):
        rows.append(torch.nn.functional.cosine_similarity(data.hidden[e].float(), data.hidden[prev].float(), dim=-1))
    return torch.stack(rows)


def simulate(layers, agree: torch.Tensor, score: torch.Tensor, threshold: float, num_layers: int) -> dict:
    """Exit at the first layer whose score exceeds the threshold; tokens that never fire run all
    layers. Returns agreement with the full model, mean layers per token and the exit share."""
    fires = score > threshold
    any_fire = fires.any(0)
    first = fires.float().argmax(0)
    depth = torch.where(any_fire, torch.tensor(layers)[first], torch.tensor(num_layers))
    ok = torch.where(any_fire, agree.gather(0, first[None])[0], torch.ones_like(any_fire))
    return {"threshold": threshold, "agreement": float(ok.float().mean()),
            "layers_per_token": float(depth.float().mean()), "exit_share": float(any_fire.float().mean())}


def calibrate(heads: ExitHeads, signals: LayerSignals, policy: str, target: float, points: int = 200,
              suffix: str = "") -> dict:
    """The threshold with the fewest layers per token whose agreement stays >= target, and the
    curve it was picked from (thresholds at quantiles of the scores). `suffix`: method options
    the signals were computed for (`/short=0`)."""
    score = signals.scores[policy]
    grid = torch.quantile(score.reshape(-1)[torch.randperm(score.numel())[:100000]].float(),
                          torch.linspace(0, 1, points))
    grid = torch.cat([grid, grid.max()[None] + 1e-6]).unique().tolist()
    num_layers = heads.model.num_layers
    curve = [simulate(heads.layers, signals.agree, score, t, num_layers) for t in grid]
    ok = [c for c in curve if c["agreement"] >= target]
    best = min(ok, key=lambda c: (c["layers_per_token"], -c["agreement"]))
    threshold = -best["threshold"] if policy == "entropy" else best["threshold"]
    return {"policy": policy, "target": target, **best, "threshold": threshold,
            "method": f"early-exit:{policy}{suffix}@{threshold:.6g}", "curve": curve}


def score_of(policy_name: str, heads: ExitHeads, signals: LayerSignals, data: Collected) -> torch.Tensor:
    """A policy's score matrix: the built-in ones from the signals, others (classifier, ...)
    by asking the policy object for `scores(layer, hidden)`."""
    if policy_name in signals.scores:
        return signals.scores[policy_name]
    policy = make_policy(policy_name, 0.5, heads.model, heads)
    if not hasattr(policy, "scores"):
        raise ValueError(f"policy {policy_name!r} cannot be calibrated offline (it has no scores())")
    with torch.inference_mode():
        return torch.stack([policy.scores(e, data.hidden[e].to(heads.model.dtype)) for e in heads.layers])
