"""`dyncomplete train-agent`: train GREEN-CODE's PPO exit agent (policy `rl@T`) for a model.

One command does it all, so it can be rerun when new exit heads land: precompute (cached per
model weights, heads, split and size), PPO, the reward curve, held-out figures per threshold.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

from ._common import add_model_options, load_from_args

THRESHOLDS = (0.5, 0.6, 0.8, 0.9, 0.92, 0.94, 0.97, 1.0)


def run(args) -> int:
    from ..exits.heads import load_heads
    from ..training.rl.data import cached
    from ..exits.agent import default_path
    from ..training.rl.reward import RewardConfig
    from ..training.rl.train import evaluate, plot_curve, stderr_log, train

    start = time.perf_counter()
    model = load_from_args(args)
    heads = load_heads(model, args.heads)
    stderr_log(f"exit heads: {heads.kind} at layers {heads.layers}")
    train_data = cached(model, heads, "train", args.tokens, args.refresh)
    calib_data = cached(model, heads, "calib", args.calib_tokens, args.refresh)
    cfg = RewardConfig(args.alpha, args.beta, args.gamma)
    net, curve, seconds = train(train_data, args.target, cfg, args.timesteps, seed=args.seed, log=stderr_log)
    rows = evaluate(net, calib_data, THRESHOLDS, model, heads)
    out = Path(args.out) if args.out else default_path(model)
    meta = {
        "model": model.name, "model_sha256": model.source_sha256, "dtype": str(model.dtype).removeprefix("torch."),
        "heads": {"kind": heads.kind, "layers": heads.layers, "date": heads.metadata.get("date")},
        "target": args.target, "reward": vars(cfg), "timesteps": args.timesteps, "seed": args.seed,
        "data": f"{len(train_data)} train-split tokens of the Python standard library; "
                f"evaluation on {len(calib_data)} calib-split tokens",
        "train_seconds": round(seconds, 1), "total_seconds": round(time.perf_counter() - start, 1),
        "final_mean_reward": curve[-1][1] if curve else None,
        "decision_macs": net.macs(), "calib": rows, "date": datetime.date.today().isoformat(),
    }
    net.save(out, meta)
    plot = out.with_name(out.stem + "_reward.png")
    plot_curve(curve, plot, f"{model.name}: PPO exit agent, target {args.target}, "
                            f"alpha/beta/gamma {cfg.alpha}/{cfg.beta}/{cfg.gamma}")
    print(json.dumps({"agent": str(out), "plot": str(plot), **{k: meta[k] for k in
                      ("train_seconds", "total_seconds", "final_mean_reward", "decision_macs", "calib")}}, indent=1))
    return 0


def register(sub) -> None:
    p = sub.add_parser("train-agent", help="train the PPO exit agent (policy rl@T) on precomputed hidden states")
    add_model_options(p)
    p.add_argument("--heads", help="exit heads file (default: the shipped ones, else logit lens)")
    p.add_argument("--target", choices=["final", "ground-truth"], default="final",
                   help="optimal exit = first layer agreeing with the final layer, or with the true token")
    p.add_argument("--alpha", type=float, default=1.0, help="reward of a right decision")
    p.add_argument("--beta", type=float, default=8.0,
                   help="penalty per layer of exiting too early (paper: 0.5 Python, 1 Java; the shipped agent: 8, "
                        "as at 0.5 the agent for smollm2-135m keeps only ~76%% agreement with the full model)")
    p.add_argument("--gamma", type=float, default=0.5, help="penalty per layer of going too deep")
    p.add_argument("--timesteps", type=int, default=300_000, help="PPO environment steps")
    p.add_argument("--tokens", type=int, default=16_000, help="train-split tokens to precompute")
    p.add_argument("--calib-tokens", type=int, default=1_000, help="held-out calib-split tokens for the figures")
    p.add_argument("--refresh", action="store_true", help="recompute the cached hidden states")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="agent file (default: the shipped location, dyncomplete/assets/MODEL/agent.safetensors)")
    p.set_defaults(run=run)
