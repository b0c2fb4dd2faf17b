"""`dyncomplete rank-tokens`: rank a model's tokens by how often the train split's code uses them
(the shortlist head's rows, `exits/shortlist.py`)."""

from __future__ import annotations

import datetime
from pathlib import Path

from ._common import add_model_options, load_from_args

LANGS = ("python", "java")  # languages whose train split can be counted


def run(args) -> int:
    from ..data.jdk_source import jdk_java_root
    from ..data.splits import source_files
    from ..exits.shortlist import rank_tokens, save_ranks

    langs = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    unknown = [lang for lang in langs if lang not in LANGS]
    if unknown or not langs:
        raise ValueError(f"--langs takes {', '.join(LANGS)} with commas between them, got {args.langs!r}")
    roots = {"python": lambda: None, "java": jdk_java_root}  # the source tree (None: the standard library)
    model = load_from_args(args)
    files = [f for lang in langs for f in source_files(roots[lang](), lang, "train")]
    tokenizer = model.tokenizer
    tokenizer.model_max_length = 1 << 30  # whole files, counted only: no length warning
    ranked, counted = rank_tokens(lambda text: tokenizer(text, add_special_tokens=False).input_ids, files)
    record = {"data": f"train split of {', '.join(langs)} ({len(files)} files, {counted} tokens)",
              "date": datetime.date.today().isoformat()}
    print(save_ranks(model, ranked, record, Path(args.out) if args.out else None))
    return 0


def register(sub) -> None:
    p = sub.add_parser("rank-tokens", help="rank the model's tokens by their frequency in the train split "
                                           "(the shortlist head's rows)")
    add_model_options(p)
    p.add_argument("--langs", default="python,java", help=f"train splits to count: {', '.join(LANGS)}")
    p.add_argument("--out", default=None, help="safetensors file (default: shipped beside the exit heads)")
    p.set_defaults(run=run)
