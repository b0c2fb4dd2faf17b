"""The benchmark runner end to end on the real SmolLM2-135M, plus its summary arithmetic."""

import json

import pytest

from dyncomplete.bench.plots import pareto_front
from dyncomplete.bench.summary import summarize
from dyncomplete.cli import main
from dyncomplete.commands.bench import method_list


def test_method_names_are_opaque_and_sweeps_expand():
    names, sweeps = method_list("hf-generate,early-exit:confidence@0.9+stop:0.5", ["early-exit:entropy@0.5,1.0"])
    assert names == ["baseline", "hf-generate", "early-exit:confidence@0.9+stop:0.5",
                     "early-exit:entropy@0.5", "early-exit:entropy@1.0"]
    assert sweeps == {"early-exit:entropy": ["early-exit:entropy@0.5", "early-exit:entropy@1.0"]}
    assert method_list("baseline,baseline", [])[0] == ["baseline"]
    with pytest.raises(ValueError, match="FAMILY@T1"):
        method_list("baseline", ["early-exit:confidence"])


def test_pareto_front():
    # (cost, quality): (2, 50) is beaten by (1, 60); (3, 60) by (1, 60); (4, 90) and (1, 60) stay
    assert pareto_front([(1, 60), (2, 50), (3, 60), (4, 90)]) == [0, 3]
    assert pareto_front([(1.0, 1.0)]) == [0]


def record(id_, method, prediction, decode_s, prefill_s=1.0, new_tokens=4, passed=None, **stats):
    s = {"prompt_tokens": 10, "cached_prompt_tokens": 2, "new_tokens": new_tokens, "prefill_s": prefill_s, "decode_s": decode_s,
         "total_s": prefill_s + decode_s, "layer_evals": 30 * new_tokens, "drafted": 0, "accepted": 0,
         "verify_steps": 0, "drafted_per_position": [], "accepted_per_position": [], "stopped_by": "newline"}
    s.update(stats)
    metrics = {"em": 100.0 * (prediction == "x"), "es": 50.0, "rouge_l": 0.5}
    if passed is not None:
        metrics["passed"] = passed
    return {"id": id_, "method": method, "prediction": prediction, "target": "x", "metrics": metrics, "stats": s,
            "compute_per_token": 1.0, "energy_j": 2.0, "energy_source": "estimate"}


def test_summary_speedups_identity_and_acceptance_by_hand():
    records = [
        record("a", "baseline", "x", decode_s=4.0, passed=True), record("b", "baseline", "y", decode_s=2.0, passed=False),
        record("a", "spec", "x", decode_s=1.0, passed=True, drafted=6, accepted=3, verify_steps=2,
               drafted_per_position=[2, 2, 2], accepted_per_position=[2, 1, 0]),
        record("b", "spec", "z", decode_s=2.0, passed=True),
    ]
    s = summarize(records, ["baseline", "spec"], {"model": "m", "dataset": "d"})
    assert s["n"] == 2 and s["model"] == "m"
    spec, base = s["methods"]["spec"], s["methods"]["baseline"]
    assert spec["speedup_vs_baseline"] == pytest.approx(6.0 / 3.0)
    assert spec["e2e_speedup_vs_baseline"] == pytest.approx(8.0 / 5.0)
    assert base["speedup_vs_baseline"] == 1.0 and base["identical_to_baseline"] == 1.0
    assert spec["identical_to_baseline"] == 0.5 and spec["pass_at_1"] == 100.0 and base["pass_at_1"] == 50.0
    assert spec["em"] == 50.0 and spec["decode_s"] == 3.0 and spec["new_tokens"] == 8
    assert spec["acceptance_rate"] == 0.5 and spec["mean_accepted_length"] == 4.0
    assert spec["acceptance_per_position"] == [1.0, 0.5, 0.0] and "acceptance_rate" not in base
    assert spec["tokens_per_s"] == pytest.approx(8 / 3) and spec["energy_j_per_token"] == pytest.approx(0.5)
    assert spec["prefill_tokens_per_s"] == pytest.approx(16 / 2.0)  # prompt tokens not served from a cache


def test_bandwidth_achieved_is_weight_bytes_times_tokens_per_second():
    records = [{**record("a", "baseline", "x", decode_s=2.0, new_tokens=10), "weight_bytes": 3e8}]
    entry = summarize(records, ["baseline"], {"memory_bandwidth_gbs": 6.0})["methods"]["baseline"]
    assert entry["bandwidth_gbs"] == pytest.approx(3e8 * 5 / 1e9) and entry["bandwidth_share"] == pytest.approx(0.25)
    assert summarize([record("a", "baseline", "x", 1.0)], ["baseline"], {})["methods"]["baseline"]["bandwidth_gbs"] is None


def test_copy_bandwidth_and_weight_bytes():
    import torch

    from dyncomplete.bench.bandwidth import measure_copy_bandwidth, measure_read_bandwidth
    from dyncomplete.models.hf import module_weight_bytes

    assert 0.1 < measure_copy_bandwidth(megabytes=16, repeats=3) < 1000
    assert 0.1 < measure_read_bandwidth(megabytes=16, repeats=3) < 1000
    layer = torch.nn.Linear(4, 8, dtype=torch.bfloat16)
    head = torch.nn.Linear(8, 5, bias=False)
    assert module_weight_bytes([layer, layer, head]) == (32 + 8) * 2 + 40 * 4  # the same layer twice counts once


def test_stop_rule_effect_by_hand():
    # the method alone: a, b wrong, c, d right; with the stop rule: a cut (wrong cut), c cut and
    # no longer exact (damaged), d cut but still exact (not damaged), b ran to its end
    alone = [record(i, "m", p, 1.0, new_tokens=4) for i, p in zip("abcd", ["y", "y", "x", "x"])]
    stopped = [record("a", "m+stop:0.5", "", 1.0, new_tokens=1, stopped_by="stop_rule"),
               record("b", "m+stop:0.5", "y", 1.0, new_tokens=4),
               record("c", "m+stop:0.5", "", 1.0, new_tokens=1, stopped_by="stop_rule"),
               record("d", "m+stop:0.5", "x", 1.0, new_tokens=2, stopped_by="stop_rule")]
    s = summarize(alone + stopped, ["m", "m+stop:0.5"], {})["methods"]
    assert "stop_rule" not in s["m"]
    assert s["m+stop:0.5"]["stop_rule"] == {"examples": 4, "wrong": 2, "right": 2, "wrong_cut": 1, "right_damaged": 1,
                                            "tokens_saved": pytest.approx(1 - 8 / 16),
                                            "layer_evals_saved": pytest.approx(1 - 8 / 16)}


def bench(out, *extra):
    return main(["bench", "--model", "smollm2-135m", "--dataset", "line-py", "--limit", "2", "--out", str(out),
                 "--no-progress", "--json", "--context-budget", "256", *extra])


@pytest.mark.model
def test_bench_end_to_end_identical_greedy_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    methods = "baseline,hf-generate"
    assert bench(out, "--dtype", "float32", "--methods", methods) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["model"] == "smollm2-135m" and summary["dataset"] == "line-py" and summary["n"] == 2
    for name in methods.split(","):
        m = summary["methods"][name]
        for key in ("em", "es", "rouge_l", "bleu", "new_tokens", "prefill_s", "decode_s", "total_s", "tokens_per_s",
                    "layer_evals_per_token", "compute_per_token", "energy_j", "energy_source",
                    "speedup_vs_baseline", "e2e_speedup_vs_baseline"):
            assert m[key] is not None, (name, key)
        assert m["identical_to_baseline"] == 1.0, name  # greedy in float32: token-identical
    assert summary["methods"]["baseline"]["layer_evals_per_token"] == 30
    lines = (out / "examples.jsonl").read_text().splitlines()
    records = [json.loads(l) for l in lines]
    assert [(r["id"], r["method"]) for r in records][:2] == [(records[0]["id"], n) for n in methods.split(",")]
    assert len({r["prediction"] for r in records if r["id"] == records[0]["id"]}) == 1
    report = (out / "report.md").read_text()
    assert "| `hf-generate` |" in report and summary["energy_source"] in report
    assert (out / "quality_vs_time.png").stat().st_size > 10_000 and (out / "quality_vs_energy.png").is_file()

    # interrupted while writing the last result: only that one runs again
    (out / "examples.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:30])
    assert bench(out, "--dtype", "float32", "--methods", methods) == 0
    capsys.readouterr()
    again = (out / "examples.jsonl").read_text().splitlines()
    assert again[:3] == lines[:3] and len(again) == 4
    assert json.loads(again[3])["method"] == "hf-generate" and json.loads(again[3])["id"] == records[3]["id"]

    assert bench(out, "--dtype", "bfloat16") == 2  # another dtype never mixes into this run
    assert "holds a run with dtype 'float32'" in capsys.readouterr().err


def test_a_run_refuses_results_of_another_weight_format(tmp_path):
    from dyncomplete.bench.runner import check_run

    config = {"model": "m", "dataset": "line-py", "dtype": "bfloat16", "quant": "int4"}
    check_run(tmp_path, config)
    check_run(tmp_path, config)  # the same format resumes
    with pytest.raises(ValueError, match="holds a run with quant 'int4', not 'none'"):
        check_run(tmp_path, {**config, "quant": "none"})
    (tmp_path / "run.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quant"}))
    with pytest.raises(ValueError, match="quant 'none', not 'int4'"):  # runs from before the field: none
        check_run(tmp_path, config)


@pytest.mark.parametrize("key", ["repo_context", "editor_guards"])
def test_a_run_refuses_results_with_the_other_context_or_guards_setting(tmp_path, key):
    from dyncomplete.bench.runner import check_run

    config = {"model": "m", "dataset": "x.jsonl", "dtype": "bfloat16", "quant": "int4", key: "off"}
    check_run(tmp_path, config)
    with pytest.raises(ValueError, match=f"holds a run with {key} 'off', not 'on'"):
        check_run(tmp_path, {**config, key: "on"})


@pytest.mark.model
def test_hf_prompt_lookup_counts_drafts_and_matches_baseline(smollm):
    from dyncomplete.engine import GenerationParams
    from dyncomplete.methods import make_method
    from dyncomplete.methods.baseline import Baseline

    ids = smollm.tokenizer("a = [1, 2, 3]\nb = [1, 2, 3]\nc = [1, 2,", add_special_tokens=False).input_ids
    params = GenerationParams(max_new_tokens=10)
    ref = Baseline().generate(smollm, ids, params)
    out = make_method("hf-generate:prompt-lookup", smollm).generate(smollm, ids, params)
    assert out.token_ids == ref.token_ids and out.text == ref.text
    s = out.stats
    assert s.drafted >= s.accepted > 0 and 0 < s.verify_steps <= s.new_tokens
    assert s.layer_evals == smollm.num_layers * (s.drafted + s.verify_steps)  # each step: its draft + 1 token
    with pytest.raises(ValueError, match="unknown hf-generate variant"):
        make_method("hf-generate:beam", smollm)


def test_the_early_exit_plot_is_drawn_only_beside_a_baseline(tmp_path):
    from dyncomplete.bench.plots import plot_exit_energy

    row = {"n": 2, "energy_j": 5.0, "rouge_l": 0.57}
    summary = {"model": "m", "dataset": "d", "n": 2, "energy_source": "estimate",
               "methods": {"baseline": row, "early-exit:margin@0.5": {"n": 2, "energy_j": 4.0, "rouge_l": 0.56}}}
    assert plot_exit_energy([summary], tmp_path / "e.png").stat().st_size > 10_000
    assert plot_exit_energy([{**summary, "methods": {"baseline": row, "lookup": row}}], tmp_path / "f.png") is None
    assert plot_exit_energy([{**summary, "methods": {"early-exit:margin@0.5": row}}], tmp_path / "g.png") is None
    tuned = {**summary, "model": "m-lite"}  # two runs, one figure: the title names both
    assert plot_exit_energy([summary, tuned, {**summary, "methods": {}}], tmp_path / "h.png").stat().st_size > 10_000


def test_a_run_from_before_the_cursor_line_option_had_it_in_the_prefix(tmp_path):
    from dyncomplete.bench.runner import check_run

    config = {"model": "m", "dataset": "x.jsonl", "dtype": "bfloat16", "quant": "int4"}
    (tmp_path / "run.json").write_text(json.dumps(config))
    check_run(tmp_path, {**config, "cursor_line": "prefix"})
    with pytest.raises(ValueError, match="holds a run with cursor_line 'prefix', not 'middle'"):
        check_run(tmp_path, {**config, "cursor_line": "middle"})
