"""The completion server through real HTTP: the official `openai` client, bad input, cancellation
(disconnect, supersede), a queue bound that answers 503 fast, and a load of 200 mixed requests."""

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from conftest import SERVE_KEY

from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline

MODEL = "smollm2-135m"
AUTH = {"Authorization": f"Bearer {SERVE_KEY}"}
PROMPTS = ["def add(a, b):\n", "import os\nimport", "class Stack:\n    def push(self, item):\n",
           "for i in range(10):\n", "# read a file\nwith open("]


def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=SERVE_KEY, timeout=300, max_retries=0)


def reference(model, prompt, n):
    """What the server should answer: greedy baseline with token healing (the server's default)."""
    ids = model.tokenizer(prompt, add_special_tokens=False).input_ids
    return Baseline().generate(model, ids, GenerationParams(max_new_tokens=n, token_healing=True)).text


def health(url):
    return httpx.get(f"{url}/health", headers=AUTH, timeout=30).json()


def wait_idle(url, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker = health(url)["worker"]
        if not worker["busy"] and not worker["queued"]:
            return worker
        time.sleep(0.2)
    raise AssertionError("the worker stayed busy")


def test_openai_client_with_and_without_suffix_streaming_and_not(served, smollm):
    url, _ = served
    api = client(url)
    assert [m.id for m in api.models.list().data] == [MODEL]
    want = reference(smollm, PROMPTS[0], 8)
    plain = api.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert plain.choices[0].text == want and plain.choices[0].finish_reason in ("length", "stop")
    assert plain.usage.completion_tokens == len(plain.model_extra["dyncomplete"]["token_layers"])
    stats = plain.model_extra["dyncomplete"]
    assert stats["layer_evals_per_token"] == 30 and stats["energy_source"] in ("rapl", "estimate", "nvml")
    assert "".join(t["text"] for t in stats["tokens"]) == want
    chunks = list(api.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert chunks[-1].model_extra["dyncomplete"]["cached_prompt_tokens"] > 0  # the first request's prompt
    fim = api.completions.create(model=MODEL, prompt=PROMPTS[0], suffix="\n\nprint(add(1, 2))\n", max_tokens=8)
    assert fim.choices[0].text == want  # SmolLM2 has no FIM tokens: the suffix is ignored, and said so
    assert "suffix is ignored" in " ".join(fim.model_extra["dyncomplete"]["notices"])
    streamed_fim = api.completions.create(model=MODEL, prompt=PROMPTS[0], suffix="x", max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in streamed_fim) == want
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b'{"model": "smollm2-135m", "prompt": "caf\xe9"}', 400, "not valid UTF-8"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": -5}).encode(), 400, "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 10**9}).encode(), 400, "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "16"}).encode(), 400, "must be an integer"),
    (json.dumps({"model": MODEL, "prompt": 42}).encode(), 400, "prompt"),
    (json.dumps({"model": MODEL, "prompt": ["a", "b"]}).encode(), 400, "list of exactly one"),
    (json.dumps({"model": MODEL, "prompt": ""}).encode(), 400, "empty"),
    (json.dumps({"model": MODEL, "prompt": "x", "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"model": MODEL, "prompt": "x", "stop": [1]}).encode(), 400, "stop"),
    (json.dumps({"model": MODEL, "prompt": "x", "token_healing": "yes"}).encode(), 400, "token_healing"),
    (json.dumps({"model": MODEL, "prompt": "x", "n": 3}).encode(), 400, "not supported"),
    (json.dumps({"model": "gpt-4", "prompt": "x"}).encode(), 404, "not served here"),
    (json.dumps({"model": MODEL, "prompt": "x", "method": "teleport"}).encode(), 400, "unknown method"),
    (json.dumps({"model": MODEL, "prompt": "x", "method": "baseline:3"}).encode(), 400, "no argument"),
    (b'{"model": "smollm2-135m", "prompt": "\\ud800"}', 400, "surrogate"),
    (b"[1, 2]", 400, "JSON object"),
]


def test_bad_input_gets_4xx_with_an_openai_error(served):
    url, _ = served
    for body, status, words in BAD:
        r = httpx.post(f"{url}/v1/completions", content=body, headers=AUTH, timeout=120)
        assert r.status_code == status, (body, r.text)
        assert words in r.json()["error"]["message"], (body, r.text)
    assert httpx.post(f"{url}/v1/completions", content=b"x" * (3 * 2**20), headers=AUTH, timeout=60).status_code == 413
    assert httpx.get(f"{url}/nowhere", headers=AUTH).json()["error"]["message"] == "Not Found"
    long = "x = 1\n" * 400  # over the 256-token budget: cut from the start, and said so
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": long, "max_tokens": 2}, headers=AUTH,
                   timeout=120)
    assert r.status_code == 200 and r.json()["dyncomplete"]["truncated_prompt"]
    assert r.json()["dyncomplete"]["prompt_tokens"] <= 256
    assert health(url)["status"] == "ok"


def test_disconnect_and_supersede_stop_the_generation(served):
    url, _ = served
    wait_idle(url)
    before = health(url)["worker"]
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 256, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        next(r.iter_lines())  # the first token has arrived: now hang up
    started = time.monotonic()
    after = wait_idle(url)
    assert after.get("stopped_disconnected", 0) == before.get("stopped_disconnected", 0) + 1
    # non-streaming: the client gives up waiting
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, headers=AUTH, timeout=3)
    after = wait_idle(url)
    assert after.get("stopped_disconnected", 0) == before.get("stopped_disconnected", 0) + 2
    assert time.monotonic() - started < 100  # 2 x 256 tokens would take far longer
    # a newer request of the same client supersedes the older one
    results = {}

    def older():
        results["old"] = httpx.post(f"{url}/v1/completions", json={**body, "stream": False},
                                    headers={**AUTH, "X-Client-Id": "editor-1"}, timeout=120).json()

    thread = threading.Thread(target=older)
    thread.start()
    while not health(url)["worker"]["busy"]:
        time.sleep(0.05)
    newer = httpx.post(f"{url}/v1/completions", json={**body, "stream": False, "max_tokens": 2},
                       headers={**AUTH, "X-Client-Id": "editor-1"}, timeout=120)
    thread.join()
    assert newer.status_code == 200
    old = results["old"]
    assert old["choices"][0]["finish_reason"] == "cancelled", old
    assert old["dyncomplete"]["stopped_by"] == "superseded" and old["dyncomplete"]["new_tokens"] < 256


def test_full_queue_answers_503_fast(served):
    """A long generation holds the worker; 100 requests of distinct clients then overflow the
    64-slot queue: the extra ones get 503 at once, the queued ones are answered in turn. (Distinct
    clients: requests of one client supersede each other and free their slots, so on a fast
    machine the queue would never fill; supersession has its own test.)"""
    url, _ = served
    wait_idle(url)

    async def storm():
        async with httpx.AsyncClient(headers=AUTH, timeout=120, limits=httpx.Limits(max_connections=128)) as http:
            async def one(i):
                t = time.monotonic()
                r = await http.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 1},
                                    headers={"X-Client-Id": f"storm-{i}"})
                return r, time.monotonic() - t
            return await asyncio.gather(*(one(i) for i in range(100)))

    body = {"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 256, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        next(r.iter_lines())
        results = asyncio.run(storm())
    codes = [r.status_code for r, _ in results]
    full = [(r, s) for r, s in results if r.status_code == 503]
    assert len(full) >= 100 - 64 - 5, codes  # a few slots may free up while the storm arrives
    assert all(r.headers["retry-after"] == "1" and s < 10 for r, s in full)
    assert all(r.json()["error"]["code"] == "queue_full" for r, _ in full)
    assert set(codes) <= {503, 200} and codes.count(200) >= 64 - 5, codes  # the queued ones are answered
    assert health(url)["status"] == "ok"


def test_200_concurrent_good_and_bad_requests(served, smollm):
    url, proc = served
    wait_idle(url)
    want = {p: reference(smollm, p, 2) for p in PROMPTS}

    def rss_mb():
        with open(f"/proc/{proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    rss_before = rss_mb()
    requests = []
    for i in range(200):
        if i % 5 == 0:  # 40 good ones, half of them streamed
            prompt = PROMPTS[i % len(PROMPTS)]
            requests.append(("good", prompt, {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": i % 10 == 0}))
        else:
            body, status, _ = BAD[i % len(BAD)]
            requests.append(("bad", status, body))

    async def send(http, kind, a, b):
        if kind == "bad":
            return await http.post(f"{url}/v1/completions", content=b)
        return await http.post(f"{url}/v1/completions", json=b)

    async def all_at_once():
        async with httpx.AsyncClient(headers=AUTH, timeout=300, limits=httpx.Limits(max_connections=200)) as http:
            return await asyncio.gather(*(send(http, *r) for r in requests))

    started = time.monotonic()
    responses = asyncio.run(all_at_once())
    elapsed = time.monotonic() - started
    for (kind, a, b), r in zip(requests, responses):
        if kind == "bad":
            assert r.status_code == a and "error" in r.json(), r.text
        elif b["stream"]:
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == want[a]
        else:
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == want[a], r.text
    assert elapsed < 240
    assert rss_mb() - rss_before < 400  # the prefix cache is bounded at 64 MiB
    assert health(url)["prefix_cache"]["bytes"] <= 64 * 2**20
