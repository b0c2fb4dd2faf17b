"""`dyncomplete train-lite`: LITE fine-tuning (LoRA, weighted loss over exit layers) on the train
split, on plain chunks of code or (`--fim`) on fill-in-the-middle examples; writes the adapter
where `--model ALIAS-lite` loads it from (the package's assets)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ._common import add_model_options


def run(args) -> int:
    from ..models import load
    from ..models.tuned import RECORD, adapter_dir, save_adapter
    from ..training.fim import fim_examples
    from ..training.lite import lite_weights, split_chunks, train_lite
    from .train_exits import parse_layers

    # LoRA wraps plain linear modules: train on unquantized float weights, whatever --quant says
    model = load(args.model, dtype=args.dtype, device=args.device, quant="none",
                 progress=lambda m: print(m, file=sys.stderr))
    layers = parse_layers(args.layers, model.num_layers)
    try:
        examples = (fim_examples(model.tokenizer, "train", args.steps, budget=args.chunk, seed=args.seed) if args.fim
                    else split_chunks(model.tokenizer, "train", args.chunk, seed=args.seed))
    except ValueError as e:
        print(f"dyncomplete: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else adapter_dir(f"{args.model}-lite")
    earlier = json.loads((Path(args.init) / RECORD).read_text()) if args.init else None
    start = time.monotonic()
    peft_model, losses = train_lite(model, layers, examples, args.steps, lr=args.lr, rank=args.rank,
                                    max_seconds=60 * args.max_minutes if args.max_minutes else None,
                                    init=args.init)
    read = [examples[step % len(examples)] for step in range(len(losses))]  # train_lite cycles through them
    record = {"base": args.model, "base_sha256": model.source_sha256, "layers": layers,
              "weights": lite_weights(layers, model.num_layers), "rank": earlier["rank"] if earlier else args.rank, "lr": args.lr,
              "chunk": args.chunk, "fim": args.fim, "seed": args.seed, "steps": len(losses),
              "tokens": sum(len(ids) for ids, _ in read),
              "target_tokens": sum(len(ids) - first for ids, first in read),
              "examples_available": len(examples), "seconds": round(time.monotonic() - start),
              "first_loss": sum(losses[:20]) / len(losses[:20]), "last_loss": sum(losses[-20:]) / len(losses[-20:])}
    if earlier:
        record["continues"] = earlier  # the run this one went on from, with its own record
    save_adapter(peft_model, out, record)
    print(json.dumps({"out": str(out), **record}))
    return 0


def register(sub) -> None:
    p = sub.add_parser("train-lite", help="LITE: LoRA fine-tuning with a weighted loss over the exit layers")
    add_model_options(p)
    p.set_defaults(dtype="float32")
    p.add_argument("--layers", default="16,18,20,22,24,26,28",
                   help="exit layers trained to be read by the final head: 12,16,20 or every:N")
    p.add_argument("--chunk", type=int, default=256, help="tokens per step (with --fim: the prompt's budget)")
    p.add_argument("--fim", action="store_true",
                   help="train on fill-in-the-middle examples (whole lines, random spans, line completions), "
                        "the loss on the middle and its end token: a FIM model that stops after the middle")
    p.add_argument("--steps", type=int, default=1200, help="steps (the learning rate decays over them)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop and save after this long")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--rank", type=int, default=16, help="LoRA rank")
    p.add_argument("--seed", type=int, default=0, help="which examples are cut and in what order")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="an adapter folder (with its lite.json) to go on training, on examples of another "
                        "--seed (its rank is kept)")
    p.add_argument("--out", default=None, help="adapter directory (default: the assets of MODEL-lite, "
                                                 "which `--model MODEL-lite` loads)")
    p.set_defaults(run=run)
