"""The editor plugins' APIs through real HTTP, with the bodies the plugins send, copied as data
into `editor_bodies/` from their source:

- llama.vscode `src/llama-server.ts` `createRequestPayload` (completion, and the `n_predict: 0`
  warm-up `updateExtraContext` sends), with `src/completion.ts` splitting the text around the
  cursor (a blank cursor line becomes `prompt: ""`, its indentation `n_indent`);
- llama.vim `autoload/llama.vim` `llama#fim` and `s:ring_update`;
- Continue `core/llm/llms/Ollama.ts` `_streamFim` (`_getGenerateOptions` with prefix and suffix)
  and the `api/show` call its constructor makes to learn whether the model fills the middle;
- the official `openai` client on `/v1/completions` (`editor_guards` as an extra field).

SmolLM2 (installed everywhere) answers each body with the shapes the clients parse; it has no FIM
tokens, so the suffix is ignored and a notice says so. Where Qwen2.5-Coder-0.5B is installed, the
same bodies get the middle of the circle example, and the guards keep the suffix's `return` out.
"""

import json
import time

import httpx
import openai
import pytest
from helpers import QWEN, SERVE_KEY, SMOL, body, ndjson, ollama_name, sse

HEADERS = {"Authorization": f"Bearer {SERVE_KEY}", "Content-Type": "application/json"}
MIDDLE = "circumference = 2 * math.pi * r"


def post(url: str, path: str, data: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=data, headers=HEADERS, timeout=300, **kwargs)


@pytest.fixture
def smol_server(server):
    return server("editor-smollm")[0]


@pytest.fixture
def qwen_server(server):
    return server("editor-qwen")[0]


pytestmark = pytest.mark.model


@pytest.mark.parametrize("name", ["llama_vscode_infill.json", "llama_vim_infill.json"])
def test_llama_cpp_clients_get_infill_answers(smol_server, name):
    """llama.cpp's whole answer (llama.vim's own body asks for some fields only: the next test)."""
    r = post(smol_server, "/infill", body(name, response_fields=[]))
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out["content"], str) and out["stop"] is True and out["stop_type"] in ("eos", "limit", "word")
    assert out["tokens_predicted"] == len(out["dyncomplete"]["token_layers"]) > 0
    assert set(out["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}
    assert out["generation_settings"]["n_ctx"] == 512 and out["tokens_cached"] >= out["tokens_evaluated"] - 1
    stats = out["dyncomplete"]
    assert stats["context_chunks"] == 1  # input_extra went into the prompt
    assert stats["method"] == "lookup"  # serve's default
    assert "suffix is ignored" in " ".join(stats["notices"])
    assert set(stats["ignored_fields"]) >= {"samplers", "t_max_prompt_ms", "top_k"}
    # streamed as llama.cpp streams; without the time cap, which makes the two differ by the clock
    whole = post(smol_server, "/infill", body(name, t_max_predict_ms=0, response_fields=[])).json()
    streamed = sse(post(smol_server, "/infill", body(name, stream=True, t_max_predict_ms=0, response_fields=[])))
    assert "".join(c["content"] for c in streamed) == whole["content"]
    assert [c["stop"] for c in streamed][-1] is True and not any(c["stop"] for c in streamed[:-1])
    assert streamed[-1]["dyncomplete"]["stopped_by"] == whole["dyncomplete"]["stopped_by"]


def test_llama_vim_gets_the_fields_it_asks_for_flat_as_llama_cpp_gives_them(smol_server):
    asked = body("llama_vim_infill.json")["response_fields"]
    # without the body's 250 ms cap, which can end the two at different tokens by the clock
    out = post(smol_server, "/infill", body("llama_vim_infill.json", t_max_predict_ms=0)).json()
    assert set(out) == set(asked)  # "tokens_cached", "timings/prompt_n", ...: the paths as names
    whole = post(smol_server, "/infill", body("llama_vim_infill.json", t_max_predict_ms=0, response_fields=[])).json()
    assert out["timings/predicted_n"] == whole["timings"]["predicted_n"] and out["content"] == whole["content"]
    bad = post(smol_server, "/infill", body("llama_vim_infill.json", response_fields=["content", 3]))
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "response_fields")


@pytest.mark.parametrize("name, answer", [("llama_vscode_warm.json", "whole"), ("llama_vim_ring_update.json", "{}")])
def test_cache_warming_requests_are_answered_without_the_model(smol_server, name, answer):
    start = time.monotonic()
    r = post(smol_server, "/infill", body(name))
    assert r.status_code == 200
    if answer == "whole":
        assert r.json()["content"] == "" and r.json()["stop"] is True
    else:  # llama.vim asks for the field "" only, which no answer has
        assert r.json() == {}
    assert time.monotonic() - start < 5


def test_continue_ollama_provider(smol_server):
    show = post(smol_server, "/api/show", body("continue_ollama_show.json", name=ollama_name(SMOL)))
    assert show.status_code == 200 and ".Suffix" not in show.json()["template"]  # no FIM: Continue sends no suffix
    tags = httpx.get(f"{smol_server}/api/tags", headers=HEADERS, timeout=30).json()
    assert [m["name"] for m in tags["models"]] == [SMOL]
    assert httpx.get(f"{smol_server}/api/version", headers=HEADERS, timeout=30).json()["version"]
    request = body("continue_ollama_generate.json", model=ollama_name(SMOL))
    request["options"]["seed"] = 7  # temperature 0.01 samples: a seed makes the stream and the whole answer comparable
    r = post(smol_server, "/api/generate", request)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = ndjson(r)
    assert all(not line["done"] for line in lines[:-1]) and lines[-1]["done"] is True
    last = lines[-1]
    assert last["done_reason"] in ("stop", "length") and last["eval_count"] == len(last["dyncomplete"]["token_layers"])
    assert last["model"] == request["model"] and last["dyncomplete"]["ignored_fields"] == ["keep_alive"]
    whole = post(smol_server, "/api/generate", {**request, "stream": False}).json()
    assert whole["done"] is True and whole["response"] == "".join(line["response"] for line in lines)


def test_editor_endpoints_refuse_bad_fields_by_name(smol_server):
    cases = [
        ("/infill", body("llama_vim_infill.json", n_indent=-1), 400, "n_indent"),
        ("/infill", body("llama_vim_infill.json", input_extra=[{"filename": "a.py"}]), 400, "input_extra"),
        ("/infill", body("llama_vim_infill.json", t_max_predict_ms="1s"), 400, "t_max_predict_ms"),
        ("/infill", body("llama_vim_infill.json", method="early-exit:rl@0.9"), 400, "method"),
        ("/api/generate", body("continue_ollama_generate.json", model="llama3:8b"), 404, "model"),
        ("/api/generate", body("continue_ollama_generate.json", model=ollama_name(SMOL), options={"temperature": 5}),
         400, "options.temperature"),
        ("/api/generate", body("continue_ollama_generate.json", model=ollama_name(SMOL), images=["aGk="]), 400,
         "images"),
    ]
    for path, data, status, param in cases:
        r = post(smol_server, path, data)
        assert (r.status_code, r.json()["error"]["param"]) == (status, param), r.text
    plain = httpx.post(f"{smol_server}/infill", content=json.dumps(body("llama_vim_infill.json")),
                       headers={"Authorization": HEADERS["Authorization"], "Content-Type": "text/plain"}, timeout=30)
    assert plain.status_code == 415  # the Content-Type check holds here too
    rebound = httpx.post(f"{smol_server}/infill", json=body("llama_vim_infill.json"),
                         headers={**HEADERS, "Host": "evil.example:8000"}, timeout=30)
    assert rebound.status_code == 403


def test_time_cap_stops_at_the_first_newline(smol_server):
    data = body("llama_vim_infill.json", input_prefix="def add(a, b):\n", prompt="", input_suffix="",
                input_extra=[], n_indent=0, t_max_predict_ms=1, response_fields=[])
    out = post(smol_server, "/infill", data).json()
    assert out["dyncomplete"]["stopped_by"] == "time_limit" and out["stop_type"] == "limit"
    assert out["content"].strip() and "\n" not in out["content"].strip()


def test_files_sent_once_come_back_as_context_for_the_same_editor_only(served):
    """The memory of sent files (on by default; the `served` server runs with it): a file sent
    in a cache-warming request is retrieved into later completions of the same editor, on the
    editor endpoints by default and on /v1/completions when asked (`test_client_files.py` has the
    other senders, the bounds and when the choice of windows is kept)."""
    url, _ = served
    geometry = "def area_of_circle(radius):\n    return 3.14159 * radius ** 2\n"
    warm = body("llama_vscode_warm.json", input_extra=[{"filename": "geometry.py", "text": geometry}])
    assert post(url, "/infill", warm).json()["content"] == ""
    cursor = {"input_prefix": "from geometry import area_of_circle\n\ndef report(radius):\n    a = area_of_circle(",
              "input_suffix": "", "prompt": "", "n_predict": 4}
    recalled = post(url, "/infill", cursor).json()["dyncomplete"]
    assert recalled["memory_chunks"] >= 1 and recalled["context_chunks"] >= 1
    alone = post(url, "/infill", {**cursor, "client_memory": False}).json()["dyncomplete"]
    assert alone["memory_chunks"] == alone["context_chunks"] == 0
    completion = {"model": SMOL, "prompt": cursor["input_prefix"], "max_tokens": 4}
    assert post(url, "/v1/completions", completion).json()["dyncomplete"]["memory_chunks"] == 0
    asked = post(url, "/v1/completions", {**completion, "client_memory": True}).json()["dyncomplete"]
    assert asked["memory_chunks"] >= 1
    health = httpx.get(f"{url}/health", headers=HEADERS, timeout=30).json()
    assert health["client_files"]["clients"] >= 1 and health["client_files"]["bytes"] >= len(geometry)


def test_lookup_drafts_from_the_same_clients_earlier_completions(served):
    """The cross-request n-gram cache: a prompt asked again has its earlier answer in the history
    only (not in its own text), lookup drafts from it, and the answer stays the same."""
    url, _ = served
    body = {"model": SMOL, "prompt": "def parse_header(line):\n    name, value =", "max_tokens": 16,
            "method": "lookup"}
    first = post(url, "/v1/completions", body).json()
    again = post(url, "/v1/completions", body).json()
    alone = post(url, "/v1/completions", {**body, "ngram_cache": False}).json()
    assert first["choices"][0]["text"] == again["choices"][0]["text"] == alone["choices"][0]["text"]
    assert again["dyncomplete"]["draft_sources"]["history"]["accepted"] > 0
    assert "history" not in alone["dyncomplete"]["draft_sources"]
    health = httpx.get(f"{url}/health", headers=HEADERS, timeout=30).json()
    assert health["ngram_cache"]["tokens"] >= first["usage"]["completion_tokens"]


def test_typing_within_a_line_prefills_only_the_typed_characters(qwen_server):
    """The cursor line goes after the middle marker (`--cursor-line middle`, the default), so the
    suffix before it stays cached while the line grows; in the prefix it would all move."""
    suffix = "\n    return circumference\n\n\ndef square(side):\n    return side * side\n\n\nprint(circle(2))\n"
    fields = ["content", "timings/prompt_n", "tokens_evaluated"]
    answers = [post(qwen_server, "/infill", body("llama_vim_infill.json", input_suffix=suffix, prompt=typed,
                                                  n_predict=4, response_fields=fields)).json()
               for typed in ("    circumference = 2", "    circumference = 2 * math")]
    assert answers[1]["tokens_evaluated"] > 40
    assert answers[1]["timings/prompt_n"] <= 4, answers[1]  # " *", " math" and the token healing held back


def test_a_new_line_above_the_cursor_reuses_the_moved_suffix(qwen_server):
    """Moving down a line (the prefix grows by the line just written, the suffix stays), the
    server's default `--cache-reuse 32` places the cached suffix at its new positions: only the
    new line and the prompt's end are prefilled, not the suffix after them."""
    suffix = "".join(f"\n\ndef size_{n}(shape):\n    return shape.width * shape.height * {n}" for n in range(12))
    prefix = "import math\n\n\ndef circle(r):\n"
    fields = ["content", "timings/prompt_n", "tokens_evaluated"]
    answers = [post(qwen_server, "/infill", body("llama_vim_infill.json", input_prefix=before, input_suffix=suffix,
                                                  input_extra=[], prompt="", n_predict=4,
                                                  response_fields=fields)).json()
               for before in (prefix, prefix + "    circumference = 2 * math.pi * r\n")]
    assert answers[1]["tokens_evaluated"] > 150, answers[1]  # the suffix is most of the prompt
    assert answers[1]["timings/prompt_n"] <= 30, answers[1]  # the new line and the prompt's end

def test_qwen_fills_the_middle_for_every_client(qwen_server):
    for name in ("llama_vscode_infill.json", "llama_vim_infill.json"):
        # the middle (the repository context makes it a `return` of the value), then the guards
        # end it: n_indent 4 cuts what Qwen writes next at column 0. Which formula the 0.5B model
        # returns is a near tie that the weight format decides (int4 with the native kernels
        # copies the context's `math.pi * r * r`; PyTorch's int4 kernel gave `2 * math.pi * r`)
        out = post(qwen_server, "/infill", body(name, response_fields=[])).json()
        content = out["content"]
        assert content.strip().startswith("return ") and "math.pi * r" in content, (name, content)
        assert "return circumference" not in content, (name, content)
        assert "def " not in content and content.strip().count("\n") == 0
        assert out["dyncomplete"]["fim"] is True and out["dyncomplete"]["context_chunks"] == 1
    show = post(qwen_server, "/api/show", body("continue_ollama_show.json")).json()
    assert ".Suffix" in show["template"]
    # Continue samples at temperature 0.01: at the line start, assigning or returning is a near tie
    # for the int4 model and the draw decides it, so the cursor goes after `circumference = `
    cursor = body("continue_ollama_generate.json")["prompt"] + "circumference = "
    lines = ndjson(post(qwen_server, "/api/generate", body("continue_ollama_generate.json", prompt=cursor)))
    text = "".join(line["response"] for line in lines)
    assert MIDDLE in cursor + text and "return" not in text
    assert lines[-1]["dyncomplete"]["stopped_by"] == "suffix_repeat"
    loose = post(qwen_server, "/infill", body("llama_vim_infill.json", editor_guards=False, response_fields=[])).json()
    # llama.cpp's rules only: its end-of-generation tokens, its indentation rule and time cap
    assert loose["dyncomplete"]["stopped_by"] in ("eos", "indent", "time_limit", "max_tokens")
    api = openai.OpenAI(base_url=f"{qwen_server}/v1", api_key=SERVE_KEY, timeout=300, max_retries=0)
    # the cursor after `circumference = `: the middle is the formula (at the line start, whether
    # the model assigns or returns is a near tie that the weight format decides)
    prefix, suffix = "import math\n\ndef circle(r):\n    circumference = ", "\n    return circumference\n"
    guarded = api.completions.create(model=QWEN, prompt=prefix, suffix=suffix, max_tokens=48,
                                     extra_body={"editor_guards": True})
    assert "2 * math.pi * r" in guarded.choices[0].text and "return" not in guarded.choices[0].text
    assert guarded.choices[0].finish_reason == "stop"
    plain = api.completions.create(model=QWEN, prompt=prefix, suffix=suffix, max_tokens=16)
    plain_text, guarded_text = plain.choices[0].text, guarded.choices[0].text
    # /v1/completions unchanged without guards: the same tokens, whichever stopped first
    assert plain_text.startswith(guarded_text) or guarded_text.startswith(plain_text), (plain_text, guarded_text)
