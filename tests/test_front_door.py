"""The front door: the README's two commands are CI's, the docs' tables are what their runs
render, and a missing extra is a one-line error."""

import json
import re
import sys
from pathlib import Path

import pytest

from dyncomplete.bench.doc_tables import render_file, stale_files
from dyncomplete.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    first_block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line for line in first_block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_commands():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == readme_commands() and len(ci) == 2


def test_docs_tables_are_what_their_runs_render():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert sum("<!-- table " in p.read_text() for p in docs) >= 2
    assert stale_files(docs) == [], "run `dyncomplete report README.md docs`"


def test_a_changed_run_makes_its_table_stale(tmp_path):
    run = tmp_path / "results" / "r1"
    run.mkdir(parents=True)
    summary = {"model": "m", "dataset": "line-py", "n": 2, "cpu": "cpu", "threads": 2, "date": "d",
               "command": "dyncomplete bench --model m", "methods": {
                   "baseline": {"n": 2, "es": 50.0, "tokens_per_s": 10.0, "speedup_vs_baseline": 1.0,
                                "identical_to_baseline": 1.0},
                   "lookup": {"n": 2, "es": 50.0, "tokens_per_s": 12.5, "speedup_vs_baseline": 1.25,
                              "identical_to_baseline": 1.0}}}
    (run / "summary.json").write_text(json.dumps(summary))
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- table bench results/r1[lookup] columns=method,tok_s,x_baseline -->\n<!-- end table -->\nmore\n")
    assert render_file(page) and stale_files([page]) == []
    text = page.read_text()
    assert "| `lookup` | 12.5 | 1.25x |" in text and "`dyncomplete bench --model m`: cpu, 2 threads, d" in text
    assert "`baseline`" not in text and text.startswith("text\n") and text.endswith("more\n")
    summary["methods"]["lookup"]["tokens_per_s"] = 11.0
    (run / "summary.json").write_text(json.dumps(summary))
    assert stale_files([page]) == [page]


def test_speed_rows_name_the_build_their_label_gives(tmp_path):
    run = {"model": "m", "quant": "int4", "decode_tok_s": 50.0, "command": "python -m dyncomplete.bench.speed",
           "cpu": "cpu", "threads": 2, "date": "d", "llama_bench": {"decode_tok_s": 25.0, "decode_x": 2.0}}
    (tmp_path / "a.json").write_text(json.dumps(run))
    (tmp_path / "b.json").write_text(json.dumps(run | {"decode_tok_s": 60.0}))
    page = tmp_path / "page.md"
    page.write_text("<!-- table speed a.json[before] b.json[after] columns=build,decode,decode_x -->\n"
                    "<!-- end table -->\n")
    render_file(page)
    text = page.read_text()
    assert "| before | 50.0 | 2.00x |" in text and "| after | 60.0 | 2.00x |" in text


def test_speed_rows_of_several_rounds_show_their_count_and_the_rounds_range(tmp_path):
    rounds = [{"decode_tok_s": 90.0, "llama_bench": {"decode_tok_s": 50.0}},
              {"decode_tok_s": 80.0, "llama_bench": {"decode_tok_s": 40.0}}]
    run = {"model": "m", "decode_tok_s": 85.0, "command": "python -m dyncomplete.bench.speed", "cpu": "cpu",
           "threads": 2, "date": "d", "llama_bench": {"decode_tok_s": 45.0, "decode_x": 1.9, "rounds": 2},
           "rounds": rounds}
    (tmp_path / "a.json").write_text(json.dumps(run))
    page = tmp_path / "page.md"
    page.write_text("<!-- table speed a.json columns=model,decode_x,rounds,decode_x_range -->\n<!-- end table -->\n")
    render_file(page)
    assert "| m | 1.90x | 2 | 1.80-2.00x |" in page.read_text()


def test_a_table_without_its_end_is_refused_and_the_page_kept(tmp_path):
    page = tmp_path / "page.md"
    text = ("<!-- table bench results/r1 -->\nkept text\n## A heading\n"
            "<!-- table bench results/r2 -->\n<!-- end table -->\n")
    page.write_text(text)
    with pytest.raises(ValueError, match="line 1 has no '<!-- end table -->'"):
        render_file(page)
    assert page.read_text() == text


def test_missing_extra_is_one_line_naming_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "dyncomplete.bench.plots", raising=False)
    rc = main(["bench", "--model", "smollm2-135m", "--dataset", "line-py", "--limit", "1",
               "--methods", "baseline", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "install the 'bench' extra (pip install 'dyncomplete[bench]')" in err
    assert not (tmp_path / "out").exists()


def test_cluster_options_need_ray_and_ray_needs_its_extra(monkeypatch, capsys, tmp_path):
    assert main(["serve", "--replicas", "2"]) == 2
    assert "--replicas need --ray ADDRESS" in capsys.readouterr().err
    assert main(["bench", "--dataset", "line-py", "--actors", "2", "--out", str(tmp_path / "out")]) == 2
    assert "--actors and --actor-cpus need --ray ADDRESS" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "dyncomplete.serve.cluster", raising=False)
    assert main(["serve", "--ray", "127.0.0.1:6379", "--replicas", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "install the 'cluster' extra (pip install 'dyncomplete[cluster]')" in err
    assert not (tmp_path / "out").exists()
