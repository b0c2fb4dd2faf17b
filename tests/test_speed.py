"""`python -m dyncomplete.bench.speed`: the decode timing and the verification-pass timing it
reports (figures of this machine; the test checks their shape and sense, not their values)."""

import json

import pytest

from dyncomplete.bench.speed import combine_rounds, main


@pytest.mark.model
def test_verify_rows_reports_passes_against_one_position(capsys):
    assert main(["--model", "smollm2-135m", "--verify-rows", "4,2", "--runs", "1", "--prompt-tokens", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["pass_ms"]) == ["1", "2", "4"] and out["relative_to_one"]["1"] == 1.0
    assert all(ms > 0 for ms in out["pass_ms"].values())


@pytest.mark.model
def test_reference_llama_bench_runs_the_same_shape_on_the_gguf_and_gives_ratios(capsys):
    from dyncomplete.bench.launch import llama_cpp_binary

    try:
        llama_cpp_binary("llama-bench")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    argv = ["--model", "smollm2-135m", "--runs", "1", "--prompt-tokens", "64", "--new-tokens", "8",
            "--reference", "llama-bench", "--rounds", "2"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    ref = out["llama_bench"]
    assert ref["gguf"] == "smollm2-135m.gguf" and ref["prefill_tok_s"] > 0 and ref["decode_tok_s"] > 0
    assert ref["rounds"] == 2 and len(out["rounds"]) == 2
    for key in ("decode", "prefill"):  # each round's ratio, then their median
        ratios = [r[f"{key}_tok_s"] / r["llama_bench"][f"{key}_tok_s"] for r in out["rounds"]]
        assert ref[f"{key}_x"] == round(sum(ratios) / 2, 2)
        assert out[f"{key}_tok_s"] == round(sum(r[f"{key}_tok_s"] for r in out["rounds"]) / 2, 1)


def test_one_pair_of_runs_gives_its_own_ratio():
    ours = {"decode_tok_s": 90.0, "prefill_tok_s": 700.0, "bandwidth_gb_s": 27.0, "decode_ms_all": [11.1]}
    reference = {"gguf": "m.gguf", "decode_tok_s": 45.0, "prefill_tok_s": 280.0}
    out = combine_rounds([(ours, reference)])
    assert out["llama_bench"] == {"gguf": "m.gguf", "prefill_tok_s": 280.0, "decode_tok_s": 45.0, "rounds": 1,
                                  "prefill_x": 2.5, "decode_x": 2.0}
    assert "rounds" not in out and out["decode_tok_s"] == 90.0


def test_rounds_without_a_reference_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", "3"])
    assert "--rounds" in capsys.readouterr().err
