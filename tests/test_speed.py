"""`python -m dyncomplete.bench.speed`: the decode timing and the verification-pass timing it
reports (figures of this machine; the test checks their shape and sense, not their values)."""

import json

import pytest

from dyncomplete.bench.speed import main


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
            "--reference", "llama-bench"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    ref = out["llama_bench"]
    assert ref["gguf"] == "smollm2-135m.gguf" and ref["prefill_tok_s"] > 0 and ref["decode_tok_s"] > 0
    assert ref["decode_x"] == round(out["decode_tok_s"] / ref["decode_tok_s"], 2)
    assert ref["prefill_x"] == round(out["prefill_tok_s"] / ref["prefill_tok_s"], 2)
