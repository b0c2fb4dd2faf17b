"""`dyncomplete complete`: complete the code before the cursor (stdin or --prefix-file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..methods.registry import family_list
from ._common import EDITOR_MODEL, add_model_options, load_from_args


def run(args) -> int:
    from ..engine import GenerationParams, build_prompt
    from ..methods import make_method

    prefix = Path(args.prefix_file).read_text() if args.prefix_file else sys.stdin.read()
    suffix = Path(args.suffix_file).read_text() if args.suffix_file else None
    params = GenerationParams(
        max_new_tokens=args.max_new_tokens if args.max_new_tokens else (48 if args.mode == "line" else 128),
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop or ()),
        line_mode=args.mode == "line",
        token_healing=args.token_healing,
    )
    model = load_from_args(args)
    prompt = build_prompt(model.tokenizer, prefix, suffix, args.context_budget)
    if prompt.notice:
        print(f"dyncomplete: notice: {prompt.notice}", file=sys.stderr)
    method = make_method(args.method, model)
    result = method.generate(model, prompt.ids, params)
    if args.json:
        stats = {**result.stats.summary(model), "model": model.name, "fim": prompt.fim,
                 "truncated_prompt": prompt.truncated}
        print(json.dumps({"completion": result.text, "stats": stats}))
    else:
        print(result.text)
    return 0


def register(sub) -> None:
    p = sub.add_parser("complete", help="complete code read from stdin (the code before the cursor)")
    add_model_options(p, EDITOR_MODEL)
    p.add_argument("--method", default="baseline",
                   help=f"decoding method, e.g. early-exit:confidence@0.9; families {family_list()}")
    p.add_argument("--prefix-file", help="file with the code before the cursor (default: stdin)")
    p.add_argument("--suffix-file", help="file with the code after the cursor (fill-in-the-middle)")
    p.add_argument("--token-healing", action=argparse.BooleanOptionalAction, default=True,
                   help="back up the prompt's last token so a cursor inside a token does not derail the model")
    p.add_argument("--mode", choices=["line", "block"], default="block", help="line: stop at the end of the line")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 48 in line mode, 128 in block mode")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--context-budget", type=int, default=1024, help="prompt tokens kept (end of prefix, start of suffix)")
    p.add_argument("--json", action="store_true", help="print completion and stats as JSON")
    p.set_defaults(run=run)
