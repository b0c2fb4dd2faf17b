"""Benchmark datasets: what to complete, the target, how to generate, and (optionally) tests.

`load_dataset(name)` knows `line-py` (built from the standard library's test split), `line-java`
(from the JDK's sources, see jdk_source.py), the
HumanEval family (`humaneval`, `humaneval-sl`, `humaneval-ml`, see humaneval_source.py) and
any CodeXGLUE-style JSON-lines file (`id`, `input`, `gt`, optional `suffix`, `lang`, `path`).
HumanEval records also carry what `program()` needs to assemble a test script.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..engine import GenerationParams
from .humaneval_source import humaneval_records, infilling_records, read_jsonl
from .linecut import build_line_completion

HUMANEVAL_STOP = ("\ndef", "\nclass", "\nif __name__", "\nprint(", "\n#")
LINE_PY_SEED = 0
LINE_PY_DEFAULT_N = 200
LINE_PARAMS = GenerationParams(max_new_tokens=48, line_mode=True)


@dataclass
class Dataset:
    name: str
    examples: list[dict]
    params: GenerationParams
    has_tests: bool = False
    notes: list[str] = field(default_factory=list)


def write_jsonl(path: Path, records: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def line_py(limit: int | None) -> Dataset:
    examples = build_line_completion(None, "python", limit or LINE_PY_DEFAULT_N, LINE_PY_SEED, split="test")
    return Dataset("line-py", examples, LINE_PARAMS,
                   notes=[f"standard-library test split, seed {LINE_PY_SEED}"])


def line_java(limit: int | None) -> Dataset:
    from .jdk_source import jdk_java_root

    examples = build_line_completion(jdk_java_root(), "java", limit or LINE_PY_DEFAULT_N, LINE_PY_SEED, split="test")
    return Dataset("line-java", examples, LINE_PARAMS,
                   notes=[f"JDK 17 java.base sources (openjdk-17-source), test split, seed {LINE_PY_SEED}"])


def line_file(path: str, limit: int | None) -> Dataset:
    records = read_jsonl(Path(path))
    for i, r in enumerate(records):
        if "input" not in r or "gt" not in r:
            raise ValueError(f"{path} line {i + 1}: a record needs 'input' and 'gt'")
        r.setdefault("id", str(i))
    ids = [str(r["id"]) for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: ids are not unique")
    return Dataset(Path(path).name, records[:limit] if limit else records, LINE_PARAMS)


def humaneval(limit: int | None) -> Dataset:
    examples = []
    for r in humaneval_records():
        examples.append({"id": r["task_id"], "lang": "python", "input": r["prompt"], "gt": r["canonical_solution"],
                         "test": r["test"], "entry_point": r["entry_point"], "prompt": r["prompt"]})
    params = GenerationParams(max_new_tokens=256, stop=HUMANEVAL_STOP)
    return Dataset("humaneval", examples[:limit] if limit else examples, params, has_tests=True)


def humaneval_infilling(kind: str, limit: int | None) -> Dataset:
    """Single- or multi-line infilling, in a seeded order so that --limit spreads over problems."""
    examples = []
    for r in infilling_records(kind):
        examples.append({"id": r["task_id"], "lang": "python", "input": r["prompt"], "suffix": r["suffix"],
                         "gt": r["canonical_solution"], "test": r["test"], "entry_point": r["entry_point"],
                         "prompt": r["prompt"]})
    random.Random(0).shuffle(examples)
    params = GenerationParams(max_new_tokens=48, line_mode=True) if kind == "sl" else GenerationParams(max_new_tokens=128)
    return Dataset(f"humaneval-{kind}", examples[:limit] if limit else examples, params, has_tests=True)


def program(example: dict, prediction: str) -> str:
    """The test script of a HumanEval example: the completed code, its tests, the check call."""
    if "suffix" in example:
        middle = prediction if prediction.endswith("\n") else prediction + "\n"
        code = example["prompt"] + middle + example["suffix"]
    else:
        code = example["prompt"] + prediction
    return f"{code}\n\n{example['test']}\n\ncheck({example['entry_point']})\n"


NAMED = {
    "line-py": line_py,
    "line-java": line_java,
    "humaneval": humaneval,
    "humaneval-sl": lambda limit: humaneval_infilling("sl", limit),
    "humaneval-ml": lambda limit: humaneval_infilling("ml", limit),
}


def load_dataset(name: str, limit: int | None = None) -> Dataset:
    """A named dataset or a JSON-lines file (.jsonl / .jsonl.gz); the first `limit` examples."""
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    if name in NAMED:
        return NAMED[name](limit)
    if Path(name).is_file():
        return line_file(name, limit)
    raise ValueError(f"unknown dataset {name!r}: use {', '.join(NAMED)} or a .jsonl file")
