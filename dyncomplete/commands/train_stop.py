"""`dyncomplete train-stop`: train the wrong-token stop rule on the train split."""

from __future__ import annotations

import datetime
from pathlib import Path

from ._common import add_model_options, load_from_args


def run(args) -> int:
    from ..training.collect import cached_collect
    from ..exits import artefacts
    from ..exits.heads import load_heads
    from ..exits.stop_rule import STOP_FILE
    from ..training.stop_rule import save_stop_rule, train_stop_rule, wrong_labels

    model = load_from_args(args)
    data = cached_collect(model, load_heads(model).layers, "train", args.tokens)
    mlp = train_stop_rule(data, steps=args.steps)
    _, wrong = wrong_labels(data)
    meta = {"data": f"stdlib train split, {len(wrong)} tokens, {float(wrong.float().mean()):.3f} wrong",
            "steps": args.steps, "date": datetime.date.today().isoformat()}
    print(save_stop_rule(model, mlp, Path(args.out) if args.out else artefacts.default_path(model, STOP_FILE), meta))
    return 0


def register(sub) -> None:
    p = sub.add_parser("train-stop", help="train the stop rule for wrong completions (METHOD+stop:T)")
    add_model_options(p)
    p.add_argument("--tokens", type=int, default=12000, help="training tokens (same cache as train-exits)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--out", default=None, help="safetensors file (default: shipped beside the exit heads)")
    p.set_defaults(run=run)
