"""Pick a policy's threshold that keeps a target agreement with the full model.

On held-out code (the calib split, teacher-forced) every exit layer's top-1 token and each
policy's `scores()` are computed once; exiting at the first layer whose score `fires()` at the
threshold is then simulated for every candidate threshold. These are the two methods the
policy's `decide` uses while decoding, and with catch-up the caches are exact, so a
teacher-forced simulation is what decoding does on the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..exits.heads import ExitHeads
from ..exits.policies import ExitPolicy, make_policy, policy_class
from ..exits.shortlist import Shortlist
from .collect import Collected


@dataclass
class LayerSignals:
    """Per exit layer (rows) and token (columns)."""

    agree: torch.Tensor  # bool: the layer's top-1 equals the final layer's
    scores: dict[str, torch.Tensor]  # policy name -> its scores()


@torch.inference_mode()
def layer_signals(heads: ExitHeads, data: Collected, policies: list[str], batch: int = 512,
                  shortlist: Shortlist | None = None) -> LayerSignals:
    """Run every exit head once on every token (the costly part: a full LM head each) and hand
    the policies the same hidden states and logits, layer after layer for each batch of tokens as
    decoding checks them (`reset` first). With a shortlist, a logit policy decides on the
    shortlist's logits and the full head confirms (`methods/early_exit.py`), so its score is
    whichever of the two fires less."""
    built = {name: make_policy(name, 0.5, heads.model, heads) for name in policies}  # scores only: any threshold
    agree, scores = [], {name: [] for name in built}
    for s in range(0, len(data), batch):
        for policy in built.values():
            policy.reset()
        agree.append([])
        for rows in scores.values():
            rows.append([])
        for e in heads.layers:
            hidden = data.hidden[e][s : s + batch].to(heads.model.dtype)
            normed = heads.normed(e, hidden)
            logits = heads.model.head(normed)
            short = shortlist.logits(normed) if shortlist is not None else None
            agree[-1].append(torch.log_softmax(logits.float(), -1).topk(2, dim=-1).indices[:, 0]
                             == data.top_ids[s : s + batch, 0])
            for name, policy in built.items():
                score = policy.scores(e, hidden, logits if policy.needs_logits else None)
                if policy.needs_logits and short is not None:
                    on_short = policy.scores(e, hidden, short)
                    score = torch.where(policy.fires(on_short, score), score, on_short)
                scores[name][-1].append(score)
    return LayerSignals(torch.cat([torch.stack(rows) for rows in agree], 1),
                        {name: torch.cat([torch.stack(rows) for rows in batches], 1) for name, batches in scores.items()})


def simulate(layers, agree: torch.Tensor, score: torch.Tensor, threshold: float, num_layers: int,
             fires=ExitPolicy.fires) -> dict:
    """Exit at the first layer whose score fires at the threshold; tokens that never fire run all
    layers. Returns agreement with the full model, mean layers per token and the exit share."""
    fired = fires(score, threshold)
    any_fire = fired.any(0)
    first = fired.float().argmax(0)
    depth = torch.where(any_fire, torch.tensor(layers)[first], torch.tensor(num_layers))
    ok = torch.where(any_fire, agree.gather(0, first[None])[0], torch.ones_like(any_fire))
    return {"threshold": threshold, "agreement": float(ok.float().mean()),
            "layers_per_token": float(depth.float().mean()), "exit_share": float(any_fire.float().mean())}


def never_fires(fires, score: torch.Tensor) -> float:
    """A threshold at which no score fires: the next float beyond the largest score, or below the
    smallest for a policy that exits below its threshold (entropy)."""
    top = score.max()
    above = torch.nextafter(top, torch.tensor(torch.inf))
    return float(above if not fires(top, above) else torch.nextafter(score.min(), torch.tensor(-torch.inf)))


def calibrate(heads: ExitHeads, signals: LayerSignals, policy: str, target: float, points: int = 200,
              suffix: str = "") -> dict:
    """The threshold with the fewest layers per token whose agreement stays >= target, and the
    curve it was picked from (thresholds at quantiles of the finite scores, and one that never
    fires). `suffix`: method options the signals were computed for (`/short=0`)."""
    score, fires = signals.scores[policy], policy_class(policy).fires
    finite = score[score.isfinite()]
    grid = torch.quantile(finite[torch.randperm(finite.numel())[:100000]].float(), torch.linspace(0, 1, points))
    grid = grid.unique().tolist() + [never_fires(fires, finite)]
    num_layers = heads.model.num_layers
    curve = [simulate(heads.layers, signals.agree, score, t, num_layers, fires) for t in grid]
    ok = [c for c in curve if c["agreement"] >= target]
    best = min(ok, key=lambda c: (c["layers_per_token"], -c["agreement"]))
    return {"policy": policy, "target": target, **best,
            "method": f"early-exit:{policy}{suffix}@{best['threshold']:.6g}", "curve": curve}
