"""bench-session's editor replay: the bodies it sends are the plugins' literal bodies with the text
fields cut from the file as llama.vim cuts them (256 lines before, the cursor line split, 64
after), for both typing patterns; and every client replayed against a real server."""

import json
import sysconfig
import tomllib
from pathlib import Path

import httpx
import pytest
from helpers import BODIES, SERVE_KEY

from dyncomplete.bench import llama_vim, session
from dyncomplete.bench.doc_tables import render_session
from dyncomplete.bench.launch import LLAMA_CPP_VERSION
from dyncomplete.cli import main
from dyncomplete.commands import bench_session

ROOT = Path(__file__).parents[1]


def typed_file(folder: Path, lines: int = 400) -> Path:
    """Line i is `vI = I`, every tenth an indented `    return I` under a `def`."""
    text = "".join(f"    return {i}\n" if i % 10 == 9 else f"def f{i}():\n" if i % 10 == 8 else f"v{i} = {i}\n"
                   for i in range(lines))
    path = folder / "typed.py"
    path.write_text(text)
    return path


def numbered(first: int, last: int) -> list[str]:
    return [f"    return {i}" if i % 10 == 9 else f"def f{i}():" if i % 10 == 8 else f"v{i} = {i}"
            for i in range(first, last)]


def cursors_on(path: Path, pattern: str, line: int) -> list:
    return [c for c in session.cursors_of(path, pattern, 0.0, 1000) if c.line == line]


def test_down_pauses_after_the_indentation_with_the_windows_of_llama_vim(tmp_path):
    cursors = session.cursors_of(typed_file(tmp_path), "down", 0.75, 2)  # lines 300 and 301 (0-based)
    assert [(c.line, c.typed, c.line_text) for c in cursors] == [(301, "", "v300 = 300"), (302, "", "v301 = 301")]
    first = cursors[0]
    assert first.before == "\n".join(numbered(300 - 256, 300)) + "\n"
    assert first.after == "\n" + "\n".join(numbered(301, 365)) + "\n"


def test_within_pauses_grow_the_prefix_and_keep_the_suffix(tmp_path):
    line = cursors_on(typed_file(tmp_path), "within", 310)  # "    return 309"
    assert [c.typed for c in line] == ["    ", "    ret", "    return"]
    assert len({c.after for c in line}) == len({c.before for c in line}) == 1
    assert line[0].after.startswith("\nv310 = 310\n")


def test_the_file_end_and_start_shorten_the_windows(tmp_path):
    path = typed_file(tmp_path, 12)
    (first, *_, last) = session.cursors_of(path, "down", 0.0, 100)
    assert first.line == 2 and first.before == "v0 = 0\n"  # line 1 has nothing before it: no pause
    assert last.line == 12 and last.after == "\n\n"


def test_ring_chunks_are_the_first_64_lines_of_at_most_16_other_files(tmp_path):
    path = typed_file(tmp_path)
    for i in range(20):
        (tmp_path / f"other{i:02d}.py").write_text("".join(f"w{j} = {j}\n" for j in range(100)))
    (tmp_path / "tiny.py").write_text("x = 1\n")  # under 3 lines: llama.vim does not pick it
    chunks = session.ring_chunks(path)
    assert len(chunks) == 16 and [c["filename"] for c in chunks][:2] == [f"{tmp_path.name}/other00.py",
                                                                          f"{tmp_path.name}/other01.py"]
    assert chunks[0]["text"] == "".join(f"w{j} = {j}\n" for j in range(64))
    assert all(set(c) == {"filename", "text", "time"} for c in chunks)


def template_of(name: str) -> dict:
    return json.loads((BODIES / name).read_text())


@pytest.mark.parametrize("client, name", [("llama-vim", "llama_vim_infill.json"),
                                          ("llama-vscode", "llama_vscode_infill.json")])
def test_infill_bodies_are_the_templates_with_the_text_fields_filled(tmp_path, client, name):
    down, typing, _ = cursors_on(typed_file(tmp_path), "within", 310)  # "    return 309"
    extra = [{"filename": "x/a.py", "text": "a = 1\n", "time": 1.0}]
    blank = session.CLIENTS[client].request(down, extra, 128, "m")
    assert set(blank.body) == set(template_of(name))
    assert blank.body | {"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_indent": 0} == \
        template_of(name) | {"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_indent": 0}
    assert (blank.body["input_prefix"], blank.body["input_suffix"]) == (down.before, down.after)
    assert blank.body["input_extra"] == extra and blank.body["n_predict"] == 128
    assert blank.body["prompt"] == ""  # whitespace only: llama.vim's model writes it, llama.vscode's server puts it back
    assert blank.target == {"llama-vim": "    return 309", "llama-vscode": "return 309"}[client]
    assert blank.body["n_indent"] == {"llama-vim": 0, "llama-vscode": 4}[client]
    typed = session.CLIENTS[client].request(typing, extra, 128, "m")
    assert (typed.body["prompt"], typed.body["n_indent"], typed.target) == ("    ret", 4, "urn 309")


def test_continue_sends_the_text_before_and_after_the_cursor(tmp_path):
    cursor = cursors_on(typed_file(tmp_path), "within", 310)[1]
    request = session.CLIENTS["continue"].request(cursor, [{"text": "unused"}], 16, "smollm2-135m")
    expected = template_of("continue_ollama_generate.json")
    assert set(request.body) == set(expected) and set(request.body["options"]) == set(expected["options"])
    assert request.body["prompt"] == cursor.before + "    ret" and request.body["suffix"] == cursor.after
    assert request.body["options"]["num_predict"] == 16 and request.body["model"] == "smollm2-135m"
    assert request.target == "urn 309"


def test_warming_bodies_carry_only_the_chunks():
    extra = [{"filename": "x/a.py", "text": "a = 1\n", "time": 1.0}]
    for client, name in [("llama-vim", "llama_vim_ring_update.json"), ("llama-vscode", "llama_vscode_warm.json")]:
        assert session.CLIENTS[client].warm(extra).body == template_of(name) | {"input_extra": extra}
    assert session.CLIENTS["continue"].warm is None


def test_the_command_names_the_tables_clients_and_patterns():
    assert set(bench_session.CLIENT_NAMES) == {*session.CLIENTS, "line"}
    assert bench_session.PATTERN_NAMES == tuple(session.PATTERNS)


def test_llama_cpp_version_is_the_pinned_reference():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["reference"]
    assert f"llama-cpp-python=={LLAMA_CPP_VERSION}" in extra


def test_a_row_without_streaming_has_no_time_to_first_token_and_renders_a_dash(tmp_path):
    answers = [{"latency_s": s, "ttft_s": None, "prompt_evaluated": e, "prompt_reused": 100 - e, "generated": 8,
                "accepted": e > 10, "es": 50.0, "lines_right": e // 50, "lines_suggested": 3, "after_accept": False}
               for s, e in [(0.1, 100), (0.2, 20), (0.3, 10)]]
    row = session.summarise_editor(answers)
    assert row["ttft_p50_ms"] is None and row["prompt_tokens_evaluated"] == 20 and row["prompt_tokens_reused"] == 80
    assert row["tokens_generated"] == 8 and row["accepted"] == 2
    assert row["lines_right"] == pytest.approx(2 / 3) and row["lines_suggested"] == 3
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"model": "m", "method": "baseline", "client": "llama-vim", "pattern": "down",
                                  "files": ["a.py"], "pauses": 3, "rows": {"llama-server": row}, "command": "x"}))
    table = render_session([(report, [])], ["row", "client", "ttft_p50", "prompt_evaluated", "prompt_reused",
                                            "generated", "exact"])
    assert table[-1] == "| llama-server | llama-vim | – | 20 | 80 | 8 | 2 of 3 |"


def test_a_taken_suggestion_asks_again_at_the_lines_end_and_counts_for_latency_only(tmp_path):
    cursor = cursors_on(typed_file(tmp_path), "within", 310)[1]
    request = session.CLIENTS["continue"].request(cursor, [], 16, "m")
    right, longer = session.scored({"text": "urn 309"}, request), session.scored({"text": "urn 309\nx = 1"}, request)
    assert session.takes(right) and not session.takes(longer)  # one line, the line's rest
    assert not session.takes(session.scored({"text": "urn 308"}, request))
    after = session.taken(cursor, "urn 309")
    assert (after.before, after.typed, after.after) == (cursor.before, "    return 309", cursor.after)
    line_start = cursors_on(typed_file(tmp_path), "within", 310)[0]  # typed: the 4 blanks
    assert session.taken(line_start, "    return 309").typed == "    return 309"  # llama.vim's answer
    assert session.taken(line_start, "return 309").typed == "    return 309"  # llama.vscode's, as shown
    answers = [{"latency_s": s, "ttft_s": None, "prompt_evaluated": 0, "prompt_reused": 9, "generated": 1,
                "accepted": True, "es": 100.0, "lines_right": 1, "lines_suggested": 1, "after_accept": a, "reused": r}
               for s, a, r in [(0.4, False, None), (0.01, True, "prefetch"), (0.5, False, "answer"),
                               (0.6, True, None)]]
    row = session.summarise_editor(answers)
    assert row["requests"] == 4 and row["after_accept"] == 2 and row["prefetch_hits"] == 0.5
    assert row["reused_share"] == 0.5 and row["after_accept_p50_ms"] == pytest.approx(305)
    assert row["accepted"] == 2 and row["p50_ms"] == pytest.approx(450)


def test_llama_vscode_shows_the_answer_after_the_indentation_typed(tmp_path):
    """On a blank line it sends `prompt` "" with `n_indent`, the server puts the blanks back, and
    the plugin shows the answer without leading blanks: right when it is the line after them."""
    line_start, third = cursors_on(typed_file(tmp_path), "within", 310)[:2]
    vscode = session.CLIENTS["llama-vscode"].request(line_start, [], 16, "m")
    assert vscode.body["prompt"] == "" and vscode.body["n_indent"] == 4 and vscode.target == "return 309"
    shown = session.scored({"text": "  return 309"}, vscode)
    assert shown["accepted"] and shown["text"] == "return 309"
    vim = session.CLIENTS["llama-vim"].request(line_start, [], 16, "m")  # the model writes the indentation
    assert vim.target == "    return 309" and session.scored({"text": "    return 309"}, vim)["accepted"]
    assert session.CLIENTS["llama-vscode"].request(third, [], 16, "m").target == "urn 309"


def test_a_suggestion_taken_whole_counts_its_lines_that_are_the_files():
    request = session.Request({}, "    x = 1", ("    y = 2", "", "z = 3"))
    scored = session.scored({"text": "    x = 1\n    y = 2\n    w = 0\n"}, request)
    assert scored["accepted"] and scored["lines_right"] == 2 and scored["lines_suggested"] == 4
    wrong_first = session.scored({"text": "    x = 2\n    y = 2"}, request)
    assert not wrong_first["accepted"] and wrong_first["lines_right"] == 0
    assert session.scored({"text": ""}, request)["lines_suggested"] == 0


@pytest.mark.model
@pytest.mark.parametrize("client, pattern, lines", [("llama-vim", "down", 2), ("llama-vscode", "within", 1),
                                                     ("continue", "down", 2), ("line", "down", 2)])
def test_every_client_replays_against_the_server(served, capsys, client, pattern, lines):
    url, _ = served
    source = Path(sysconfig.get_paths()["stdlib"]) / "colorsys.py"
    argv = ["bench-session", "--model", "smollm2-135m", "--url", url, "--api-key", SERVE_KEY, "--source", str(source),
            "--client", client, "--pattern", pattern, "--start", "0.3", "--lines", str(lines), "--n-predict", "8",
            "--max-tokens", "8", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["client"], report["pauses"]) == (client, {"within": 3}.get(pattern, 2))
    for row in report["rows"].values():
        assert row["requests"] == report["pauses"] and row["p95_ms"] >= row["p50_ms"] > 0
        assert row["tokens_generated"] > 0 and row["prompt_tokens_evaluated"] + row["prompt_tokens_reused"] > 0
        assert 0 <= row["accepted"] <= row["requests"] and 0 <= row["es"] <= 100
        assert (row["ttft_p50_ms"] is None) == (client.startswith("llama-"))
        if client == "llama-vim":  # each shown suggestion is followed by the speculative request, unless cached
            assert 0 <= row["from_client_cache"] <= 1 and row["background_requests"] > 0


@pytest.mark.model
def test_llama_server_rows_replay_the_same_bodies(tmp_path, capsys):
    """llama-server (built by install-reference.sh) on Qwen2.5-Coder-0.5B's own GGUF file, plain and
    with n-gram drafting: a row each, started and stopped in turn. llama-server's /infill needs
    a model with FIM tokens, which SmolLM2 has not."""
    from dyncomplete.bench.launch import llama_cpp_binary
    from dyncomplete.models import REGISTRY

    try:
        llama_cpp_binary("llama-server")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    if not REGISTRY["qwen2.5-coder-0.5b"].installed():
        pytest.skip("qwen2.5-coder-0.5b is not installed: run `dyncomplete install qwen2.5-coder-0.5b`")
    source = typed_file(tmp_path, 40)
    (tmp_path / "other.py").write_text("def g(x):\n    return x * 2\n\n\nprint(g(3))\n")
    argv = ["bench-session", "--model", "qwen2.5-coder-0.5b", "--server", "llama-server", "--server-args", "-c 2048",
            "--server-args", "-c 2048 --spec-type ngram-mod", "--source", str(source), "--start", "0.5",
            "--lines", "2", "--n-predict", "8", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["rows"]) == ["llama-server -c 2048", "llama-server -c 2048 --spec-type ngram-mod"]
    for row in report["rows"].values():
        assert row["requests"] == 2 and row["ttft_p50_ms"] is None and row["tokens_generated"] > 0
        assert row["prompt_tokens_evaluated"] + row["prompt_tokens_reused"] > 0


def test_served_columns_count_what_the_server_did_over_the_replay_only():
    before = {"hits": 2, "lookups": 4, "tokens": 100, "reused": 3, "drafted_rows": 10, "drafted_rows_cut": 4,
              "batch_sizes": {1: 5}, "batch_seconds": {1: 0.1}, "busy_s": 1.0}
    after = {"hits": 10, "lookups": 14, "tokens": 300, "reused": 8, "drafted_rows": 40, "drafted_rows_cut": 16,
             "batch_sizes": {1: 5, 3: 2, 4: 6}, "batch_seconds": {1: 0.1, 3: 0.06, 4: 0.3}, "busy_s": 7.5}
    out = session.served_columns(before, after, requests=20, wall_s=10.0)
    assert out["completions_per_s"] == 2.0 and out["tokens_per_s"] == 20.0 and out["server_reused_share"] == 0.25
    assert out["prefix_cache_hit_share"] == 0.8 and out["batch_sizes"] == {3: 2, 4: 6} and out["batch_p50"] == 4.0
    assert out["batch_ms"] == pytest.approx({3: 30.0, 4: 50.0}) and out["model_busy_share"] == pytest.approx(0.65)
    assert (out["drafted_rows"], out["drafted_rows_cut"]) == (30, 12)
    assert session.served_columns(None, after, 20, 10.0)["tokens_per_s"] is None  # another server: no counters


@pytest.mark.model
def test_an_editor_that_types_between_pauses_asks_again_only_after_its_typing_time(served, tmp_path):
    """With --think-ms the next pause comes 0.5-1.5x that long after an answer shows; llama.vim's
    background requests run within that time, so the editor waits only for what is left of it."""
    url, _ = served
    cursors = session.cursors_of(typed_file(tmp_path), "down", 0.5, 3)
    headers = {"Authorization": f"Bearer {SERVE_KEY}"}
    def gaps(results):  # from each answer to the next pause
        return [after["at_s"] - r["at_s"] - r["latency_s"] for r, after in zip(results, results[1:])]

    typing = session.replay_editor(url, "smollm2-135m", "llama-vim", cursors, 8, headers, think_ms=1500)
    assert len(typing) == 3 and all(r["think_s"] + r["background_s"] >= 0.75 - 1e-6 for r in typing)
    assert all(gap >= 0.75 for gap in gaps(typing))
    assert len({round(r["think_s"] + r["background_s"], 3) for r in typing}) == 3  # typing times vary
    assert all(r["waited_s"] == r["latency_s"] + r["held_back_s"] for r in typing)
    at_once = session.replay_editor(url, "smollm2-135m", "llama-vim", cursors, 8, headers)
    assert all(r["think_s"] == 0 and r["held_back_s"] == 0 for r in at_once)
    assert all(gap - r["background_s"] < 0.1 for gap, r in zip(gaps(at_once), at_once))


@pytest.mark.model
def test_a_pause_that_comes_before_the_background_requests_end_waits_for_them(served, tmp_path):
    """llama.vim sends no request while one of its own runs: a user who pauses 1-3 ms after a
    suggestion shows waits for the speculative request, until llama.vim's next retry, and the
    replay counts that wait in `waited_s` and sends the request only then."""
    url, _ = served
    cursors = session.cursors_of(typed_file(tmp_path), "down", 0.5, 6)
    headers = {"Authorization": f"Bearer {SERVE_KEY}"}
    fast = session.replay_editor(url, "smollm2-135m", "llama-vim", cursors, 8, headers, think_ms=2)
    retry = llama_vim.RETRY_S
    for r, after in zip(fast, fast[1:]):
        held = after["held_back_s"]
        if after["from_cache"]:  # shown at once from the plugin's cache
            assert held == 0
            continue
        assert r["background_s"] - 0.003 <= held < r["background_s"] + retry  # until the first retry after them
        assert abs(held / retry - round(held / retry)) < 1e-6
        assert after["at_s"] - (r["at_s"] + r["latency_s"]) >= held  # sent at that retry, not before
        assert after["waited_s"] == after["latency_s"] + held
    assert sum(r["held_back_s"] > 0 for r in fast) >= 2
    summary = session.summarise_editor(fast)
    assert summary["held_back_share"] == sum(r["held_back_s"] > 0 for r in fast) / len(fast)


@pytest.mark.model
def test_a_typing_editor_asks_at_its_keystrokes_and_the_server_answers_every_request_counted(served, tmp_path):
    """--keystroke-ms: llama.vim asks at every typed character while none of its requests runs, so
    the pauses on a later line come after the line before them was typed character by character
    and after requests sent meanwhile; the server finishes exactly the requests the replay counts."""
    url, _ = served
    cursors = session.cursors_of(typed_file(tmp_path), "down", 0.5, 4)
    headers = {"Authorization": f"Bearer {SERVE_KEY}"}

    def finished() -> int:
        worker = httpx.get(f"{url}/health", headers=headers).json()["worker"]
        return sum(n for key, n in worker.items() if key.startswith("stopped_"))

    before = finished()
    results = session.replay_editor(url, "smollm2-135m", "llama-vim", cursors, 8, headers, keystroke_ms=40)
    sent = 1 + sum(not r["from_cache"] for r in results) + sum(r["background_requests"] for r in results)
    assert finished() - before == sent  # the warm-up, the pauses' own and those sent while typing
    assert sum(r["background_requests"] for r in results[1:]) >= len(results) - 1
    for r, cursor, after in zip(results[1:], cursors, cursors[1:]):
        keys = len(cursor.line_text) - len(cursor.typed) + after.line - cursor.line  # the line's rest, Enter
        assert 0.5 * 0.04 * keys - 0.01 <= r["think_s"]
        assert r["waited_s"] >= r["held_back_s"] >= 0
    with pytest.raises(ValueError, match="llama-vim only"):
        session.replay_editor(url, "smollm2-135m", "llama-vim", cursors, 8, headers, think_ms=100, keystroke_ms=40)


@pytest.mark.model
def test_several_editor_counts_get_a_row_each_and_the_table_says_how_many(tmp_path, capsys):
    """`--concurrent 1 2`: a row for one editor and a row for two, each from a server started for
    it; the documents' editors column reads each row's count."""
    first = typed_file(tmp_path, 60)
    second = tmp_path / "second.py"
    second.write_text(first.read_text().replace("v", "w"))
    out = tmp_path / "runs" / "sizes.json"  # a folder that does not exist yet
    argv = ["bench-session", "--model", "smollm2-135m", "--source", str(first), str(second), "--start", "0.5",
            "--lines", "2", "--n-predict", "8", "--concurrent", "1", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["editors"] == [1, 2] and list(report["rows"]) == ["dyncomplete, 1 editor", "dyncomplete, 2 editors"]
    assert [row["editors"] for row in report["rows"].values()] == [1, 2]
    assert all(row["requests"] == report["pauses"] == 4 for row in report["rows"].values())
    table = render_session([(out, [])], ["row", "editors", "n"])
    assert table[-2:] == ["| dyncomplete, 1 editor | 1 | 4 |", "| dyncomplete, 2 editors | 2 | 4 |"]


@pytest.mark.parametrize("command", [["bench-session", "--url", "http://127.0.0.1:9"], ["calibrate"]])
def test_an_out_path_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys, command):
    """A replay or a calibration takes minutes: its --out is checked first (`out_file`), not when
    the report is written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [*command, "--model", "smollm2-135m", "--out", str(blocker / "r.json")]
    assert main(argv) != 0
    assert str(blocker) in capsys.readouterr().err


def test_several_editor_counts_against_a_running_server_are_refused(capsys):
    argv = ["bench-session", "--model", "smollm2-135m", "--url", "http://127.0.0.1:9", "--concurrent", "1", "2"]
    assert main(argv) != 0
    assert "several --concurrent values start a server for each" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--client", "line"], ["--think-ms", "100"]])
def test_keystrokes_are_refused_for_any_replay_but_llama_vims_alone(capsys, extra):
    argv = ["bench-session", "--model", "smollm2-135m", "--url", "http://127.0.0.1:9", "--keystroke-ms", "100", *extra]
    assert main(argv) != 0
    assert "--keystroke-ms replays llama.vim's keystrokes" in capsys.readouterr().err
