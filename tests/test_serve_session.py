"""`dyncomplete bench-session` against the running test server: both rows, the cache serving
prompt tokens only in the cache-on row, and identical completions with and without it."""

import json
import sysconfig
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import SERVE_KEY

from dyncomplete.cli import main
from dyncomplete.bench.session import pauses_of


def test_pauses_follow_the_typed_file(tmp_path):
    source = tmp_path / "f.py"
    source.write_text("import os\n\ndef f(x):\n    return x + 1\n")
    pauses = pauses_of(source, 0.0, 10)  # the first line has nothing before the cursor: no pause
    assert [(p.line, p.target) for p in pauses] == [(3, "def f(x):"), (4, "    return x + 1")]
    assert pauses[1].prefix == "import os\n\ndef f(x):\n"


@pytest.mark.model
def test_bench_session_reports_both_rows(served, capsys):
    url, _ = served
    source = Path(sysconfig.get_paths()["stdlib"]) / "colorsys.py"
    argv = ["bench-session", "--model", "smollm2-135m", "--url", url, "--api-key", SERVE_KEY, "--source", str(source),
            "--start", "0.02", "--lines", "3", "--max-tokens", "4", "--client", "line", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    on, off = report["rows"]["cache on"], report["rows"]["cache off"]
    assert on["requests"] == off["requests"] == 3
    assert off["cached_prompt_share"] == 0 and on["cached_prompt_share"] > 0.3
    assert report["identical_completions"] == 1.0
    assert on["p50_ms"] > 0 and on["ttft_p50_ms"] <= on["p95_ms"] and 0 <= on["accepted"] <= 3


@pytest.mark.model
def test_bench_session_allows_the_method_it_replays(served, capsys, monkeypatch):
    """The server bench-session starts allows (and builds) just the method it replays; here the
    test server stands in for it, which allows baseline and lookup."""
    import dyncomplete.bench.launch as launch
    import dyncomplete.bench.session as session

    url, proc = served
    started = []
    replay = session.replay

    @contextmanager
    def fake_server(model, *options, **kwargs):
        started.append(options)
        yield url, proc

    monkeypatch.setattr(launch, "running_server", fake_server)
    monkeypatch.setattr(session, "replay", lambda *args, **kwargs: replay(*args[:5], SERVE_KEY, *args[6:], **kwargs))
    source = Path(sysconfig.get_paths()["stdlib"]) / "colorsys.py"
    argv = ["bench-session", "--model", "smollm2-135m", "--method", "lookup", "--source", str(source),
            "--start", "0.02", "--lines", "1", "--max-tokens", "2", "--client", "line", "--json"]
    assert main(argv) == 0
    (options,) = started
    assert options[options.index("--methods") + 1] == "lookup" and options[options.index("--method") + 1] == "lookup"
    assert json.loads(capsys.readouterr().out)["method"] == "lookup"
