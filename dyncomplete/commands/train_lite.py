"""`dyncomplete train-lite`: LITE fine-tuning (LoRA, weighted loss over exit layers); writes a
peft adapter directory."""

from __future__ import annotations

import json

from ._common import add_model_options, load_from_args


def run(args) -> int:
    from ..training.collect import code_chunks
    from ..training.lite import lite_weights, train_lite
    from .train_exits import parse_layers

    model = load_from_args(args)
    layers = parse_layers(args.layers, model.num_layers)
    chunks = code_chunks(model.tokenizer, "train", args.tokens, chunk=args.chunk)
    peft_model, losses = train_lite(model, layers, chunks, args.steps, lr=args.lr, rank=args.rank)
    peft_model.save_pretrained(args.out)
    print(json.dumps({"out": args.out, "weights": lite_weights(layers, model.num_layers),
                      "first_loss": losses[0], "last_loss": losses[-1], "losses": losses}))
    return 0


def register(sub) -> None:
    p = sub.add_parser("train-lite", help="LITE: LoRA fine-tuning with a weighted loss over the exit layers")
    add_model_options(p)
    p.add_argument("--layers", default=None, help="exit layers: 12,16,20 or every:N (default as train-exits)")
    p.add_argument("--tokens", type=int, default=4000, help="training tokens (train split)")
    p.add_argument("--chunk", type=int, default=128, help="tokens per step")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--rank", type=int, default=8, help="LoRA rank")
    p.add_argument("--out", required=True, help="adapter directory")
    p.set_defaults(run=run)
