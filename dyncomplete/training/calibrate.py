"""Pick a policy's threshold that keeps a target agreement with the full model.

On held-out code (the calib split, teacher-forced) every exit layer's top-1 token and each
policy's `scores()` are computed once; exiting at the first layer whose score `fires()` at the
threshold is then simulated for every candidate threshold. These are the two methods the
policy's `decide` uses while decoding, and with catch-up the caches are exact, so a
teacher-forced simulation is what decoding does on the same text.
"""

from __future__ import annotations

import itertools
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
             fires=ExitPolicy.fires, check_cost: float = 0.0) -> dict:
    """Exit at the first layer whose score fires at the threshold; tokens that never fire run all
    layers. Returns agreement with the full model, mean layers and checks per token, the exit
    share, and the cost per token in layers: layers run plus `check_cost` layers a check."""
    fired = fires(score, threshold)
    any_fire = fired.any(0)
    first = fired.float().argmax(0)
    depth = torch.where(any_fire, torch.tensor(layers)[first], torch.tensor(num_layers))
    checks = torch.where(any_fire, first + 1, torch.tensor(len(layers))).float().mean()
    ok = torch.where(any_fire, agree.gather(0, first[None])[0], torch.ones_like(any_fire))
    layers_per_token = float(depth.float().mean())
    return {"threshold": threshold, "agreement": float(ok.float().mean()), "layers_per_token": layers_per_token,
            "checks_per_token": float(checks), "cost_per_token": layers_per_token + check_cost * float(checks),
            "exit_share": float(any_fire.float().mean())}


def never_fires(fires, score: torch.Tensor) -> float:
    """A threshold at which no score fires: the next float beyond the largest score, or below the
    smallest for a policy that exits below its threshold (entropy)."""
    top = score.max()
    above = torch.nextafter(top, torch.tensor(torch.inf))
    return float(above if not fires(top, above) else torch.nextafter(score.min(), torch.tensor(-torch.inf)))


def calibrate(heads: ExitHeads, signals: LayerSignals, policy: str, target: float, points: int = 200,
              suffix: str = "", layers: list[int] | None = None, check_cost: float = 0.0) -> dict:
    """The threshold with the lowest cost per token (layers, plus `check_cost` layers a check)
    whose agreement stays >= target, and the curve it was picked from (thresholds at quantiles of
    the finite scores, and one that never fires). `suffix`: method options the signals were
    computed for (`/short=0`); `layers`: check only these of the heads' layers (`/at=`)."""
    layers = layers or heads.layers
    rows = [heads.layers.index(e) for e in layers]
    score, fires = signals.scores[policy][rows], policy_class(policy).fires
    finite = score[score.isfinite()]
    grid = torch.quantile(finite[torch.randperm(finite.numel())[:100000]].float(), torch.linspace(0, 1, points))
    grid = grid.unique().tolist() + [never_fires(fires, finite)]
    num_layers = heads.model.num_layers
    curve = [simulate(layers, signals.agree[rows], score, t, num_layers, fires, check_cost) for t in grid]
    ok = [c for c in curve if c["agreement"] >= target]
    best = min(ok, key=lambda c: (c["cost_per_token"], -c["agreement"]))
    at = "" if layers == heads.layers else "/at=" + ".".join(map(str, layers))
    return {"policy": policy, "target": target, "layers": layers, **best,
            "method": f"early-exit:{policy}{suffix}{at}@{best['threshold']:.6g}", "curve": curve}


def calibrate_checks(heads: ExitHeads, signals: LayerSignals, policy: str, target: float, sizes=(2, 3, 4),
                     check_cost: float = 0.0, points: int = 50) -> dict:
    """`calibrate` over every set of `sizes` check layers among the heads' layers the policy scores:
    the set and threshold with the lowest cost per token at `target` agreement (SkipDecode and
    SWIFT fix their layer sets too, instead of checking every layer). For policies whose score at
    a layer does not depend on the other checks (not `saturation`)."""
    scored = [e for e, row in zip(heads.layers, signals.scores[policy]) if row.isfinite().any()]
    results = (calibrate(heads, signals, policy, target, points, layers=list(layers), check_cost=check_cost)
               for size in sizes for layers in itertools.combinations(scored, size))
    best = min(results, key=lambda r: (r["cost_per_token"], -r["agreement"]))
    return {k: v for k, v in best.items() if k != "curve"}
