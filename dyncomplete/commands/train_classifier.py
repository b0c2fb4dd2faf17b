"""`dyncomplete train-classifier`: train the per-layer exit classifiers (ICSE 2024) on the train
split, for the shipped (or given) exit heads."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from ._common import add_model_options, load_from_args


def run(args) -> int:
    from ..exits.classifier import CLASSIFIER_FILE
    from ..training.classifier import save_classifier, train_classifier
    from ..training.collect import cached_collect
    from ..exits import artefacts
    from ..exits.heads import load_heads

    model = load_from_args(args)
    heads = load_heads(model, args.heads)
    start = time.time()
    data = cached_collect(model, heads.layers, "train", args.tokens)
    mlps = train_classifier(heads, data, steps=args.steps)
    meta = {"heads": heads.kind, "data": f"stdlib train split, {len(data)} tokens", "steps": args.steps,
            "date": datetime.date.today().isoformat(), "train_seconds": round(time.time() - start)}
    out = save_classifier(model, mlps, Path(args.out) if args.out else artefacts.default_path(model, CLASSIFIER_FILE), meta)
    print(out)
    return 0


def register(sub) -> None:
    p = sub.add_parser("train-classifier", help="train the exit classifiers on the train split")
    add_model_options(p)
    p.add_argument("--heads", default=None, help="exit heads file (default: the shipped heads)")
    p.add_argument("--tokens", type=int, default=150_000, help="training tokens (same cache as train-exits)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--out", default=None, help="safetensors file (default: shipped beside the heads)")
    p.set_defaults(run=run)
