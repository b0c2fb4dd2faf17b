"""`/v1/chat/completions`: the model's chat template makes the prompt, which runs as a completion;
OpenAI's chat shapes whole and streamed, the same one-line refusals, and the official client."""

import openai
import pytest
from helpers import SERVE_KEY, TINY_SERVED, sse, tiny_served_model
from starlette.testclient import TestClient

from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline
from dyncomplete.serve import Settings, create_app

AUTH = {"Authorization": f"Bearer {SERVE_KEY}"}
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
CHAT = {"model": TINY_SERVED, "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": [{"type": "text", "text": "say hi"}]}],
        "max_tokens": 6}


def app(tiny, **changes):
    settings = Settings(methods=(), api_key=SERVE_KEY, max_tokens_limit=48, cache_bytes=2**22, **changes)
    return TestClient(create_app(tiny, settings), base_url="http://localhost", headers=AUTH)


@pytest.fixture(scope="module")
def tiny():
    model = tiny_served_model(fim=False)
    model.tokenizer.chat_template = TEMPLATE
    return model


def test_whole_answer_is_the_templated_prompt_completed(tiny):
    prompt = "<system>be brief\n<user>say hi\n<assistant>"
    ids = tiny.tokenizer(prompt, add_special_tokens=False).input_ids
    want = Baseline().generate(tiny, ids, GenerationParams(max_new_tokens=6, token_healing=False)).text
    with app(tiny) as http:
        out = http.post("/v1/chat/completions", json=CHAT).json()
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    choice = out["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": want} and choice["finish_reason"] in ("stop", "length")
    assert out["usage"]["prompt_tokens"] == len(ids) and out["dyncomplete"]["cached_prompt_tokens"] == 0


def test_stream_is_chat_chunks_then_done(tiny):
    with app(tiny) as http:
        whole = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        r = http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream") and r.text.rstrip().endswith("data: [DONE]")
    chunks = sse(r)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("change, param", [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 49}, "max_completion_tokens"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"n": 2}, "n"),
    ({"method": "lookup"}, "method"),
])
def test_bad_chat_bodies_get_one_line_refusals(tiny, change, param):
    with app(tiny) as http:
        r = http.post("/v1/chat/completions", json={**CHAT, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]


def test_a_model_without_a_chat_template_says_so(tiny):
    plain = tiny_served_model(fim=False)
    with app(plain) as http:
        r = http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"


@pytest.mark.model
def test_official_client_chats_whole_and_streamed(served):
    url, _ = served
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=SERVE_KEY, timeout=300, max_retries=0)
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    whole = api.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=12, temperature=0)
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant" and text and whole.usage.completion_tokens <= 12
    streamed = api.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=12, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text
