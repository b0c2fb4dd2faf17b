"""`dyncomplete train-exits`: train per-layer translator heads on the train split (frozen model)."""

from __future__ import annotations

import json
import time

from ._common import add_model_options, load_from_args


def parse_layers(text: str | None, num_layers: int) -> list[int]:
    """`12,16,20` or `every:N` (every N-th layer) -> exit layers in 1..L-1. Default: every second
    layer from 40% of the depth (shallower exits almost never agree with the final layer)."""
    if not text:
        return list(range(2 * round(0.2 * num_layers), num_layers, 2))
    if text.startswith("every:"):
        step = int(text.split(":")[1])
        return list(range(step, num_layers, step))
    return sorted({int(x) for x in text.split(",")})


def run(args) -> int:
    from ..training.collect import cached_collect
    from ..exits.heads import default_path, lens_heads
    from ..training.translators import agreement, train_translators

    model = load_from_args(args)
    layers = parse_layers(args.layers, model.num_layers)
    start = time.time()
    data = cached_collect(model, layers, "train", args.tokens)
    heads = train_translators(model, data, steps=args.steps, batch=args.batch, base_vocab=args.shortlist)
    calib = cached_collect(model, layers, "calib", args.eval_tokens)
    trained, lens = agreement(heads, calib), agreement(lens_heads(model, layers), calib)
    heads.metadata = {
        "train_tokens": len(data), "steps": args.steps, "batch": args.batch, "dtype": str(model.dtype),
        "train_seconds": round(time.time() - start),
        "calib_agreement": {"tokens": len(calib), "translator": trained, "lens": lens},
    }
    out = heads.save(args.out or default_path(model), data=f"stdlib train split, {len(data)} tokens")
    print(json.dumps({"out": str(out), "agreement": {e: [round(lens[e], 3), round(trained[e], 3)] for e in layers}}))
    return 0


def register(sub) -> None:
    p = sub.add_parser("train-exits", help="train translator exit heads (frozen model) on the train split")
    add_model_options(p)
    p.add_argument("--layers", default=None, help="exit layers: 12,16,20 or every:N (default: every second from 40%% of the depth)")
    p.add_argument("--tokens", type=int, default=150_000, help="training tokens (train split; SmolLM2's holds about 125k)")
    p.add_argument("--eval-tokens", type=int, default=2000, help="calib-split tokens for the agreement report")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=384)
    p.add_argument("--shortlist", type=int, default=768, help="frequent tokens in every step's KL (plus the batch's teacher top-4)")
    p.add_argument("--out", default=None, help="safetensors file (default: the shipped heads of the model)")
    p.set_defaults(run=run)
