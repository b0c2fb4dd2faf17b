"""`dyncomplete data`: build line-completion and cross-file datasets; show the file-level splits."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def line_completion(args) -> int:
    from ..data.datasets import write_jsonl
    from ..data.linecut import build_line_completion

    split = args.split or ("all" if args.source else "test")
    examples = build_line_completion(args.source, args.lang, args.n, args.seed, None if split == "all" else split,
                                     args.max_input_chars, args.suffix_chars)
    write_jsonl(Path(args.out), examples)
    print(f"dyncomplete: {len(examples)} {args.lang} examples ({split} split of "
          f"{args.source or 'the standard library'}) -> {args.out}", file=sys.stderr)
    return 0


def cross_file(args) -> int:
    from ..data.crossfile import build_cross_file
    from ..data.datasets import write_jsonl

    examples = build_cross_file(Path(args.repo), args.n, args.seed, args.max_input_chars)
    write_jsonl(Path(args.out), examples)
    chunks = sum(len(e["extra"]) for e in examples) / len(examples)
    print(f"dyncomplete: {len(examples)} cross-file examples from {args.repo}, {chunks:.1f} context chunks "
          f"each -> {args.out}", file=sys.stderr)
    return 0


def splits(args) -> int:
    from ..data.splits import SPLITS, source_files, split_of, stdlib_root

    root = Path(args.source) if args.source else stdlib_root()
    files = [p.relative_to(root).as_posix() for p in source_files(root, lang=args.lang)]
    by_split = {name: [f for f in files if split_of(f) == name] for name in SPLITS}
    if args.list:
        print("\n".join(by_split[args.list]))
    else:
        print(json.dumps({"root": str(root), "lang": args.lang,
                          **{name: len(fs) for name, fs in by_split.items()}}, indent=2))
    return 0


def register(sub) -> None:
    from ..data.splits import EXTENSIONS, SPLITS

    p = sub.add_parser("data", help="build line-completion datasets; show the train/calib/test file split")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    lc = actions.add_parser("line-completion", help="cut CodeXGLUE-style line-completion examples from source files")
    lc.add_argument("--source", help="folder of source files (default: the standard library of this Python)")
    lc.add_argument("--lang", default="python", choices=sorted(EXTENSIONS))
    lc.add_argument("--n", type=int, default=200, help="number of examples")
    lc.add_argument("--seed", type=int, default=0)
    lc.add_argument("--split", choices=[*SPLITS, "all"],
                    help="files of one split only (default: test for the standard library, all for --source)")
    lc.add_argument("--max-input-chars", type=int, default=2500, help="keep the last N characters before the cursor")
    lc.add_argument("--suffix-chars", type=int, default=0, help="also store N characters after the line as suffix")
    lc.add_argument("--out", required=True, help="JSON-lines file to write")
    lc.set_defaults(run=line_completion)
    cf = actions.add_parser("cross-file", help="cut lines that use a name from another file of a package, "
                                                "with the repository context an editor would send")
    cf.add_argument("--repo", required=True, help="a multi-file Python package (e.g. one under site-packages)")
    cf.add_argument("--n", type=int, default=200, help="number of examples")
    cf.add_argument("--seed", type=int, default=0)
    cf.add_argument("--max-input-chars", type=int, default=2500, help="keep the last N characters before the cursor")
    cf.add_argument("--out", required=True, help="JSON-lines file to write")
    cf.set_defaults(run=cross_file)
    sp = actions.add_parser("splits", help="how many files each split holds (or --list one split's files)")
    sp.add_argument("--source", help="folder of source files (default: the standard library)")
    sp.add_argument("--lang", default="python", choices=sorted(EXTENSIONS))
    sp.add_argument("--list", choices=list(SPLITS), help="print the files of this split")
    sp.set_defaults(run=splits)
