"""Options shared by the sub-commands that load a model."""

from __future__ import annotations

import sys
from pathlib import Path

from ..models import DEFAULT_MODEL


# `serve` and `complete` fill the middle between prefix and suffix, which needs a FIM code model
# (SmolLM2, the default elsewhere, has no FIM tokens and ignores the suffix).
EDITOR_MODEL = "qwen2.5-coder-0.5b"
EDITOR_METHOD = "lookup"  # serve's default: lossless, and faster at the editor replays' pauses (docs/results.md)


def positive(kind, zero: bool = False):
    """An argparse type of `kind` that is > 0 (>= 0 with `zero`)."""
    def parse(text):
        value = kind(text)
        if value < 0 or value == 0 and not zero:
            raise ValueError(f"must be {'>=' if zero else '>'} 0, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def out_file(path: str | None) -> Path | None:
    """An `--out` file with its folder made now: a path that cannot be written fails before the
    minutes of work whose report goes there, not after them."""
    if not path:
        return None
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write --out {path} ({exc.strerror}: {exc.filename})") from exc
    return Path(path)


def add_model_options(parser, default: str = DEFAULT_MODEL) -> None:
    parser.add_argument("--model", default=default,
                        help=f"alias, local HF directory or .gguf path (default: {default})")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="auto: bfloat16 where the CPU computes it natively, else float32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--quant", default="auto", choices=["auto", "none", "int8", "int4"],
                        help="weight-only quantization of every linear layer and the LM head in groups of 32 "
                             "(CPU; llama, qwen2; int8: closer to the published weights, slower); auto: int4 "
                             "where the fast engine runs in bfloat16 on the CPU, else none")


def load_from_args(args):
    from ..models import load

    return load(args.model, dtype=args.dtype, device=args.device, progress=lambda m: print(m, file=sys.stderr),
                quant=getattr(args, "quant", "none"))
