"""The server without weights: the editors' literal bodies (`editor_bodies/`) and bad input through
the whole app in process (FastAPI's TestClient), served by a 3-layer llama with random weights and
a byte tokenizer built here (helpers.tiny_served_model): status codes, each API's response shape,
the one-line refusals. Then request parsing (request.py, editors.py) on its own."""

import json

import pytest
from helpers import SERVE_KEY, TINY_SERVED, body, ndjson, ollama_name, sse, tiny_served_model
from starlette.testclient import TestClient

from dyncomplete.engine import EditorGuards, GenerationParams
from dyncomplete.engine.repo_context import RepoContext
from dyncomplete.serve import Settings, create_app
from dyncomplete.serve.editors import cursor_indent, only_fields, parse_generate, parse_infill, response_fields
from dyncomplete.serve.request import (CHARS_PER_TOKEN, MIN_TOP_P, ApiError, clip_context, clip_prompt, decode_body,
                                       parse_completion)
from dyncomplete.serve.worker import Job

AUTH = {"Authorization": f"Bearer {SERVE_KEY}"}
LIMIT, BUDGET, MAX_BODY = 48, 512, 64 * 1024
OLLAMA = ollama_name(TINY_SERVED)  # "tiny:llama", as Continue would name it
VIM, VSCODE = "llama_vim_infill.json", "llama_vscode_infill.json"
WARMING = ["llama_vscode_warm.json", "llama_vim_ring_update.json"]
# what each sends that we do not use, and its top_p and time cap
LLAMA_IGNORED = {VSCODE: ["samplers", "t_max_prompt_ms", "top_k"], VIM: ["id_slot", "samplers", "t_max_prompt_ms", "top_k"]}
TOP_P, TIME_CAP_S = {VSCODE: 0.99, VIM: 0.90}, {VSCODE: 1.0, VIM: 0.25}


def settings(**changes) -> Settings:
    """Kept answers off: these tests repeat requests to compare how each path generates them."""
    return Settings(**{"methods": (), "api_key": SERVE_KEY, "max_tokens_limit": LIMIT, "context_budget": BUDGET,
                       "cache_bytes": 2**22, "max_body_bytes": MAX_BODY, "suggestions": False, **changes})


@pytest.fixture(scope="module")
def tiny():
    return tiny_served_model(fim=True)


@pytest.fixture
def http(tiny):
    """A client of a fresh app (its own worker, caches and memories) around the tiny model."""
    with TestClient(create_app(tiny, settings()), base_url="http://localhost", headers=AUTH) as client:
        yield client


def refusal(r, status: int, param: str | None = None, code: str | None = None) -> str:
    """The one-line OpenAI-style error of a refused request; its message."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "\n" not in error["message"], error
    assert error["param"] == param and (code is None or error["code"] == code), error
    return error["message"]


# -- the editors' bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [VSCODE, VIM])
def test_llama_cpp_bodies_get_llama_cpp_answers(http, name):
    """llama.cpp's whole answer (llama.vim asks for some fields only, which come flat: below)."""
    out = http.post("/infill", json=body(name, t_max_predict_ms=0, response_fields=[])).json()
    assert isinstance(out["content"], str) and out["stop"] is True and out["stop_type"] in ("eos", "limit", "word")
    assert out["model"] == TINY_SERVED and out["has_new_line"] == ("\n" in out["content"])
    assert out["generation_settings"] == {"n_ctx": BUDGET, "n_predict": LIMIT, "temperature": 0.0,
                                          "top_p": TOP_P[name], "stop": [], "stream": False}
    assert out["tokens_predicted"] == len(out["dyncomplete"]["token_layers"]) > 0
    assert set(out["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}
    stats = out["dyncomplete"]
    assert stats["fim"] is True and stats["context_chunks"] == 1 and stats["notices"] == []
    assert stats["ignored_fields"] == LLAMA_IGNORED[name] and stats["method"] == "baseline"
    r = http.post("/infill", json=body(name, t_max_predict_ms=0, stream=True, response_fields=[]))
    assert r.headers["content-type"].startswith("text/event-stream") and "[DONE]" not in r.text  # llama.cpp sends none
    events = sse(r)
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert [e["tokens_predicted"] for e in events[:-1]] == list(range(1, len(events)))
    assert "".join(e["content"] for e in events) == out["content"] and events[-1]["content"] == ""
    assert events[-1]["dyncomplete"]["stopped_by"] == stats["stopped_by"]


@pytest.mark.parametrize("name", WARMING)
def test_cache_warming_bodies_are_answered_without_the_model_and_remembered(http, name):
    for stream in (False, True):
        r = http.post("/infill", json=body(name, stream=stream, response_fields=[]))
        out = sse(r)[0] if stream else r.json()
        assert r.status_code == 200 and out["content"] == "" and out["stop"] is True and "dyncomplete" not in out
        assert out["tokens_predicted"] == 0 and out["generation_settings"]["stream"] is stream
    health = http.get("/health").json()
    assert not [key for key in health["worker"] if key.startswith("stopped_")]  # no job ran
    assert health["client_files"]["clients"] == 1  # the files it sent are kept for this editor


def test_response_fields_keep_the_paths_asked_for_flat():
    """As llama.cpp's `json_get_nested_values`: llama.vim's fields, and its ring update's [""] (none)."""
    out = {"content": "x", "timings": {"prompt_n": 3, "predicted_n": 2}, "stop": True}
    assert only_fields(["content", "timings/prompt_n", "timings/nothing", "stop/deeper"], out) == \
        {"content": "x", "timings/prompt_n": 3}
    assert only_fields([""], out) == {} and only_fields([], out) == out
    assert response_fields(body(VIM)) == body(VIM)["response_fields"]
    with pytest.raises(ApiError, match="response_fields"):
        response_fields({"response_fields": "content"})


def test_llama_vim_gets_its_fields_and_an_empty_answer_to_its_ring_update(http):
    out = http.post("/infill", json=body(VIM, t_max_predict_ms=0)).json()
    assert set(out) == set(body(VIM)["response_fields"]) and isinstance(out["timings/predicted_n"], int)
    assert http.post("/infill", json=body("llama_vim_ring_update.json")).json() == {}


def test_continue_ollama_bodies(http):
    show = http.post("/api/show", json=body("continue_ollama_show.json", name=OLLAMA)).json()
    assert ".Suffix" in show["template"] and show["capabilities"] == ["completion", "insert"]  # Continue sends a suffix
    tags = http.get("/api/tags").json()
    assert [(m["name"], m["details"]["family"]) for m in tags["models"]] == [(TINY_SERVED, "llama")]
    assert http.get("/api/version").json()["version"]
    request = body("continue_ollama_generate.json", model=OLLAMA)
    request["options"]["seed"] = 7  # temperature 0.01 samples: the seed makes the stream and the whole answer equal
    r = http.post("/api/generate", json=request)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = ndjson(r)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert all(set(line) == {"model", "created_at", "response", "done"} for line in lines[:-1])
    last = lines[-1]
    assert last["model"] == OLLAMA and last["done_reason"] in ("stop", "length") and last["response"] == ""
    assert last["eval_count"] == len(last["dyncomplete"]["token_layers"]) <= LIMIT  # num_predict 4096 capped
    assert last["dyncomplete"]["ignored_fields"] == ["keep_alive"] and last["dyncomplete"]["fim"] is True
    whole = http.post("/api/generate", json={**request, "stream": False}).json()
    assert whole["done"] is True and whole["response"] == "".join(line["response"] for line in lines)
    for warming in ({"options": {"num_predict": 0}}, {"prompt": "", "suffix": ""}):
        r = http.post("/api/generate", json={**request, "stream": False, **warming})
        assert r.json()["done"] is True and r.json()["response"] == "" and "dyncomplete" not in r.json()


def test_ollama_show_without_fim_tokens_names_no_suffix():
    with TestClient(create_app(tiny_served_model(fim=False), settings(api_key=None)),
                    base_url="http://localhost") as http:
        show = http.post("/api/show", json=body("continue_ollama_show.json", name=OLLAMA)).json()
        out = http.post("/infill", json=body(VIM, t_max_predict_ms=0, response_fields=[])).json()
    assert ".Suffix" not in show["template"] and show["capabilities"] == ["completion"]
    assert out["dyncomplete"]["fim"] is False and "suffix is ignored" in " ".join(out["dyncomplete"]["notices"])


def test_openai_completions_whole_and_streamed(http):
    request = {"model": TINY_SERVED, "prompt": "def add(a, b):\n", "suffix": "\n", "max_tokens": 6, "user": "u1",
               "logit_bias": {}, "n": 1, "frobnicate": True}
    out = http.post("/v1/completions", json=request).json()
    assert out["id"].startswith("cmpl-") and out["object"] == "text_completion" and out["model"] == TINY_SERVED
    (choice,) = out["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason"}
    assert choice["finish_reason"] in ("stop", "length")
    usage, stats = out["usage"], out["dyncomplete"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] == stats["prompt_tokens"] + \
        stats["new_tokens"]
    assert stats["ignored_fields"] == ["frobnicate"] and stats["fim"] is True and stats["memory_chunks"] == 0
    r = http.post("/v1/completions", json={**request, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream") and r.text.endswith("data: [DONE]\n\n")
    events = sse(r)
    assert all(e["choices"][0]["finish_reason"] is None and "usage" not in e for e in events[:-1])
    assert events[-1]["choices"][0]["finish_reason"] == choice["finish_reason"] and events[-1]["usage"] == usage
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]


# -- refusals -----------------------------------------------------------------------------------------

COMPLETION = {"model": TINY_SERVED, "prompt": "def f(x):\n"}
BAD = [
    # (path, body, status, param, code)
    ("/v1/completions", {"model": TINY_SERVED}, 400, "prompt", None),
    ("/v1/completions", {**COMPLETION, "prompt": ["a", "b"]}, 400, "prompt", None),
    ("/v1/completions", {**COMPLETION, "prompt": [1, 2, 3]}, 400, "prompt", None),
    ("/v1/completions", {**COMPLETION, "prompt": ""}, 400, "prompt", None),
    ("/v1/completions", {**COMPLETION, "prompt": "\ud800"}, 400, "prompt", "invalid_utf8"),
    ("/v1/completions", {"prompt": "x"}, 400, "model", None),
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("/v1/completions", {**COMPLETION, "max_tokens": "16"}, 400, "max_tokens", None),
    ("/v1/completions", {**COMPLETION, "max_tokens": True}, 400, "max_tokens", None),
    ("/v1/completions", {**COMPLETION, "max_tokens": LIMIT + 1}, 400, "max_tokens", None),
    ("/v1/completions", {**COMPLETION, "temperature": 2.5}, 400, "temperature", None),
    ("/v1/completions", {**COMPLETION, "top_p": 0}, 400, "top_p", None),
    ("/v1/completions", {**COMPLETION, "seed": 2**70}, 400, "seed", None),
    ("/v1/completions", {**COMPLETION, "stop": [1]}, 400, "stop", None),
    ("/v1/completions", {**COMPLETION, "stop": ["x"] * 17}, 400, "stop", None),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, 400, "stream", None),
    ("/v1/completions", {**COMPLETION, "n": 2}, 400, "n", None),  # refused, not silently one answer
    ("/v1/completions", {**COMPLETION, "echo": True}, 400, "echo", None),
    ("/v1/completions", {**COMPLETION, "method": "lookup"}, 400, "method", "method_not_allowed"),
    ("/v1/completions", {**COMPLETION, "method": "no such method!"}, 400, "method", "method_not_allowed"),
    ("/infill", body(VIM, input_prefix=5), 400, "input_prefix", None),
    ("/infill", body(VIM, n_predict="128"), 400, "n_predict", None),
    ("/infill", body(VIM, n_indent=-1), 400, "n_indent", None),
    ("/infill", body(VIM, t_max_predict_ms="1s"), 400, "t_max_predict_ms", None),
    ("/infill", body(VIM, input_extra=[{"filename": "a.py"}]), 400, "input_extra", None),
    ("/infill", body(VIM, input_extra={"text": "x"}), 400, "input_extra", None),
    ("/infill", body(VIM, cache_prompt="yes"), 400, "cache_prompt", None),
    ("/infill", body(VSCODE, top_p=1.5), 400, "top_p", None),
    ("/infill", body(VSCODE, editor_guards=1), 400, "editor_guards", None),
    ("/api/generate", body("continue_ollama_generate.json"), 404, "model", "model_not_found"),
    ("/api/generate", {"prompt": "x"}, 400, "model", None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, options={"temperature": 5}), 400,
     "options.temperature", None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, options={"stop": 3}), 400, "options.stop",
     None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, options={"num_ctx": 4}), 400,
     "options.num_ctx", None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, options="fast"), 400, "options", None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, images=["aGk="]), 400, "images", None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, system="be brief"), 400, "system", None),
    ("/api/generate", body("continue_ollama_generate.json", model=OLLAMA, suffix=["x"]), 400, "suffix", None),
]


def test_bad_fields_are_refused_by_name_in_one_line(http):
    for path, data, status, param, code in BAD:  # json.dumps: httpx's own encoding refuses a lone surrogate
        refusal(http.post(path, content=json.dumps(data), headers={"Content-Type": "application/json"}), status,
                param, code)
    assert http.get("/health").json()["worker"]["queued"] == 0  # none of them took a queue slot


@pytest.mark.parametrize("path", ["/v1/completions", "/infill", "/api/generate", "/api/show"])
def test_bodies_that_are_not_json_objects(http, path):
    json_headers = {"Content-Type": "application/json"}
    cases = [(b"{", "invalid_json"), (b"[1, 2]", "invalid_json"), (b'{"prompt": "\xff"}', "invalid_utf8"),
             (b"[" * 50_000, "invalid_json"), (b'{"n": ' + b"9" * 5000 + b"}", "invalid_json")]
    for raw, code in cases:
        refusal(http.post(path, content=raw, headers=json_headers), 400, code=code)
    big = json.dumps({"prompt": "x" * MAX_BODY}).encode()
    refusal(http.post(path, content=big, headers=json_headers), 413, code="body_too_large")
    refusal(http.post(path, content=b"{}", headers={"Content-Type": "text/plain"}), 415, code="unsupported_media_type")


def test_key_host_and_unknown_routes(http):
    refusal(http.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401, code="invalid_api_key")
    refusal(http.post("/infill", json=body(VIM), headers={"Authorization": ""}), 401, code="invalid_api_key")
    assert http.get("/", headers={"Authorization": ""}).status_code == 200  # the page holds nothing secret
    refusal(http.get("/health", headers={"Host": "evil.example"}), 403, code="host_not_allowed")
    refusal(http.get("/v2/nothing"), 404)
    refusal(http.get("/v1/completions"), 405)
    model = http.get("/v1/models").json()["data"][0]
    assert (model["id"], model["num_layers"], model["methods"]) == (TINY_SERVED, 3, ["baseline"])


def test_a_full_queue_answers_503_with_retry_after(tiny):
    """A client not entered runs no lifespan: the worker never starts and its queue of one fills."""
    app = create_app(tiny, settings(queue_size=1, api_key=None))
    app.state.server.worker.submit(Job(prefix="x", suffix=None, params=GenerationParams(), method="baseline", editor="",
                                       use_cache=False, client_id=None, deadline=float("inf"), emit=lambda event: None))
    r = TestClient(app, base_url="http://localhost").post("/v1/completions", json=COMPLETION)
    refusal(r, 503, code="queue_full")
    assert r.headers["retry-after"] == "1"


# -- parsing on its own ---------------------------------------------------------------------------------


def test_parse_completion_maps_every_field():
    obj = {"model": "m", "prompt": ["def f():\n"], "suffix": "\n", "max_tokens": 7, "temperature": 1, "top_p": 0.5,
           "seed": 3, "stop": "\n\n", "user": "alice", "prefix_cache": False, "token_healing": False,
           "editor_guards": True, "ngram_cache": False, "stream": True, "zzz": 1, "aaa": 2}
    req = parse_completion(obj, "m", ["baseline", "lookup"], 16, client_header="editor-1")
    assert (req.prefix, req.suffix, req.method, req.stream) == ("def f():\n", "\n", "baseline", True)
    assert (req.client_id, req.prefix_cache, req.client_memory, req.ngram_cache) == ("editor-1", False, False, False)
    p = req.params
    assert (p.max_new_tokens, p.temperature, p.top_p, p.seed, p.stop, p.token_healing) == \
        (7, 1.0, 0.5, 3, ("\n\n",), False)
    assert p.editor == EditorGuards.for_cursor("def f():\n", "\n")
    assert req.ignored_fields == ["aaa", "zzz"] and req.ignored() == {"ignored_fields": ["aaa", "zzz"]}
    plain = parse_completion({"model": "m", "prompt": "x", "user": "bob", "method": "lookup"}, "m",
                             ["baseline", "lookup"], 16)
    assert (plain.client_id, plain.method, plain.params.max_new_tokens, plain.params.editor) == ("bob", "lookup", 16,
                                                                                                None)
    assert plain.ignored() == {} and plain.params.top_p == 1.0 and plain.stream is False
    tiny_top_p = parse_completion({"model": "m", "prompt": "x", "top_p": 1e-300}, "m", ["baseline"], 16)
    assert tiny_top_p.params.top_p == MIN_TOP_P  # kept above float32's zero: the top token survives


def test_parse_infill_of_each_llama_cpp_body():
    vim = parse_infill(body(VIM), "m", ["baseline"], LIMIT)
    assert vim.prefix == "import math\n\ndef circle(r):\n    " and vim.suffix == "\n    return circumference\n"
    vscode = parse_infill(body(VSCODE), "m", ["baseline"], LIMIT)
    assert vscode.prefix == vim.prefix  # the blank cursor line comes back from n_indent
    for req in (vim, vscode):
        assert (req.model, req.stream, req.prefix_cache, req.client_memory, req.warm_only) == \
            ("m", False, True, True, False)
        assert [(c.filename, c.text) for c in req.context.chunks] == [("geometry/area.py",
                                                                      "def area(r):\n    return math.pi * r * r\n")]
    for req, name in ((vim, VIM), (vscode, VSCODE)):
        assert req.params.max_new_tokens == LIMIT and req.params.top_p == TOP_P[name]
        assert req.params.editor == EditorGuards.for_cursor(req.prefix, req.suffix, TIME_CAP_S[name], 4)
        assert req.ignored_fields == LLAMA_IGNORED[name]
    assert parse_infill(body(VIM, n_predict=-1), "m", ["baseline"], LIMIT).params.max_new_tokens == LIMIT
    unguarded = parse_infill(body(VIM, editor_guards=False, t_max_predict_ms=0, n_indent=0), "m", ["baseline"], LIMIT)
    assert unguarded.params.editor is None and "editor_guards" not in unguarded.ignored_fields
    assert parse_infill(body(VIM, editor_guards=False), "m", ["baseline"], LIMIT).params.editor == EditorGuards(0.25, 4)
    for name in WARMING:
        assert parse_infill(body(name), "m", ["baseline"], LIMIT).warm_only
    extra = body(VIM, input_extra=[{"filename": "a.py", "text": "A"}, {"filename": "b.py", "text": "B"}])
    assert [c.filename for c in parse_infill(extra, "m", ["baseline"], LIMIT).context.chunks] == ["b.py", "a.py"]


def test_parse_generate_of_continues_body():
    req = parse_generate(body("continue_ollama_generate.json"), "qwen2.5-coder-0.5b", ["baseline"], LIMIT, BUDGET)
    assert (req.model, req.stream) == ("qwen2.5-coder:0.5b", True)
    assert (req.prefix, req.suffix) == ("import math\n\ndef circle(r):\n    ", "\n    return circumference\n")
    assert req.params.max_new_tokens == LIMIT and req.params.temperature == 0.01 and len(req.params.stop) == 9
    assert req.budget == BUDGET and req.ignored_fields == ["keep_alive"] and not req.warm_only
    assert req.params.editor == EditorGuards.for_cursor(req.prefix, req.suffix)
    small = parse_generate(body("continue_ollama_generate.json", model="qwen2.5-coder:0.5b:latest",
                                options={"num_ctx": 64, "mirostat": 2, "zz": 1}), "qwen2.5-coder-0.5b", ["baseline"],
                           LIMIT, BUDGET)
    assert small.budget == 64 and small.ignored_fields == ["keep_alive", "options.zz"]
    assert parse_generate({"model": "m:latest", "prompt": "x"}, "m", ["baseline"], LIMIT, BUDGET).suffix is None
    with pytest.raises(ApiError, match="not served here"):
        parse_generate({"model": "m:7b", "prompt": "x"}, "m", ["baseline"], LIMIT, BUDGET)


def test_decode_body_and_clipping():
    assert decode_body(b'{"a": 1}') == {"a": 1}
    for raw in (b"", b"null", b'"x"', b"\xfe"):
        with pytest.raises(ApiError):
            decode_body(raw)
    budget = 8
    limit = budget * CHARS_PER_TOKEN
    lines = "".join(f"line {i:04d}\n" for i in range(200))
    prefix, suffix, clipped = clip_prompt(lines, "s" * (limit + 5), budget)
    assert clipped and len(prefix) <= limit and lines.endswith(prefix) and prefix.startswith("line ")
    assert suffix == "s" * limit
    longer, _, _ = clip_prompt(lines + "line 0200\n", None, budget)
    assert longer == prefix + "line 0200\n"  # one more line typed: the cut moves in steps, not with each line
    assert clip_prompt("short", "tail", budget) == ("short", "tail", False)
    context = RepoContext.from_records([{"filename": "a", "text": "x" * (limit // 2 - 1)},
                                        {"filename": "b", "text": "y" * limit}, {"filename": "c", "text": ""}])
    assert [c.filename for c in clip_context(context, budget).chunks] == ["a"]
    assert clip_context(RepoContext.from_records([{"text": "z" * limit}]), budget) is None


def test_cursor_indent_follows_the_file():
    assert cursor_indent("def f():\n", "\n", 4) == "    "
    assert cursor_indent("def f():\n\tx = 1\n", "", 1) == "\t"
    assert cursor_indent("def f():\n", "return x\n", 4) == ""  # text after the cursor on its line: not a blank line
    assert cursor_indent("def f(", "", 4) == ""
