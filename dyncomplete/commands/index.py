"""`dyncomplete index`: tokenize source files once into a datastore for `retrieval:NAME` drafting."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ._common import add_model_options, load_from_args


def run(args) -> int:
    from tqdm import tqdm

    from ..data.splits import EXTENSIONS, source_files, stdlib_root
    from ..methods.datastore import Datastore, store_dir, tokenizer_digest

    roots = [Path(p) for p in args.paths] or [stdlib_root()]
    for root in roots:
        if not root.is_dir():
            raise ValueError(f"not a folder: {root}")
    folder = store_dir(args.model, args.name)  # checks the name before any work
    model = load_from_args(args)
    folder = store_dir(model.name, args.name)
    files = [f for root in roots for f in source_files(root, args.lang, args.split)
             if not set(args.exclude) & set(f.relative_to(root).parts[:-1])]
    if not files:
        raise ValueError(f"no {args.lang} files ({', '.join(EXTENSIONS[args.lang])}) under {', '.join(map(str, roots))}"
                         + (f" in the {args.split} split" if args.split else ""))
    started = time.perf_counter()
    documents = []
    for path in tqdm(files, desc="tokenize", unit="file", file=sys.stderr):
        text = path.read_text(encoding="utf-8", errors="replace")
        documents.append(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    tokenize_s = time.perf_counter() - started
    meta = {"model": model.name, "tokenizer": tokenizer_digest(model.tokenizer), "lang": args.lang,
            "split": args.split, "excluded": args.exclude, "roots": [str(r.resolve()) for r in roots], "files": len(files),
            "tokenize_seconds": round(tokenize_s, 2)}
    store = Datastore.build(documents, separator=len(model.tokenizer), meta=meta)
    store.save(folder)
    size = sum(f.stat().st_size for f in folder.iterdir())
    report = dict(store.meta, name=args.name, path=str(folder), bytes=size,
                  build_seconds=round(time.perf_counter() - started, 2))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"datastore {args.name!r} for {model.name}: {report['files']} files, {report['tokens']:,} tokens, "
              f"{size / 2**20:.1f} MiB, built in {report['build_seconds']:.1f} s (tokenize {tokenize_s:.1f} s, "
              f"sort {report['sort_seconds']:.1f} s) -> {folder}; use it as retrieval:{args.name}")
    return 0


def register(sub) -> None:
    from ..data.splits import EXTENSIONS, SPLITS

    p = sub.add_parser("index", help="build a datastore of code for retrieval drafting (retrieval:NAME)")
    p.add_argument("paths", nargs="*", help="source folders (default: the Python standard library)")
    add_model_options(p)
    p.add_argument("--name", required=True, help="the store's name, used as retrieval:NAME")
    p.add_argument("--lang", default="python", choices=sorted(EXTENSIONS), help="which files to read")
    p.add_argument("--split", default=None, choices=sorted(SPLITS),
                   help="only the files of this split (by a hash of their path, as data/splits.py assigns "
                        "them); benchmarks read `test`, so index `train` of the same tree")
    p.add_argument("--exclude", action="append", default=[], metavar="FOLDER",
                   help="skip files under folders of this name (repeatable), e.g. a package a benchmark reads")
    p.add_argument("--json", action="store_true", help="print the store's figures as JSON")
    p.set_defaults(run=run)
