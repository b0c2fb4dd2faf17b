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
