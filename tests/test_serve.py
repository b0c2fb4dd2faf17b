"""The completion server through real HTTP: the official `openai` client, bad input, cancellation
(disconnect, supersede), a queue bound that answers 503 fast, and a load of 200 mixed requests;
then what a hostile client tries: methods that load models or read paths, huge prompts, forged
Host headers and cross-site bodies, huge or endless request heads, bodies Python cannot parse,
superseding another client's request."""

import asyncio
import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers import SERVE_KEY

from dyncomplete.engine import GenerationParams
from dyncomplete.methods.baseline import Baseline

MODEL = "smollm2-135m"
AUTH = {"Authorization": f"Bearer {SERVE_KEY}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}
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


@pytest.mark.model
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
    # what Python cannot turn into values: each was a plain-text 500
    (b'{"model": "smollm2-135m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, "too many digits"),
    (b'{"model": "smollm2-135m", "prompt": "x", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "too deeply"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 10**4000}).encode(), 400, "between 1 and 256"),
    (json.dumps({"model": MODEL, "prompt": "x", "seed": 2**70, "temperature": 1}).encode(), 400, "seed"),
    # methods outside the allow-list: no model loads, no paths read
    (json.dumps({"model": MODEL, "prompt": "x", "method": "draft-model:smollm2-135m"}).encode(), 400, "not allowed"),
    (json.dumps({"model": MODEL, "prompt": "x", "method": "early-exit:confidence/heads=/etc/passwd@0.9"}).encode(),
     400, "not allowed"),
]


@pytest.mark.model
def test_bad_input_gets_4xx_with_an_openai_error(served):
    url, _ = served
    for body, status, words in BAD:
        r = httpx.post(f"{url}/v1/completions", content=body, headers=JSON_AUTH, timeout=120)
        assert r.status_code == status, (body[:80], r.text)
        assert words in r.json()["error"]["message"], (body[:80], r.text)
        assert len(r.json()["error"]["message"]) < 400
    r = httpx.post(f"{url}/v1/completions", content=b"x" * (3 * 2**20), headers=JSON_AUTH, timeout=60)
    assert r.status_code == 413
    assert httpx.get(f"{url}/nowhere", headers=AUTH).json()["error"]["message"] == "Not Found"
    long = "x = 1\n" * 400  # over the 256-token budget: cut from the start, and said so
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": long, "max_tokens": 2}, headers=AUTH,
                   timeout=120)
    assert r.status_code == 200 and r.json()["dyncomplete"]["truncated_prompt"]
    assert r.json()["dyncomplete"]["prompt_tokens"] <= 256
    # a vanishing nucleus keeps the top token (it used to round to 0 in float32 and keep none)
    tiny_nucleus = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 2, "top_p": 1e-300, "temperature": 1}
    r = httpx.post(f"{url}/v1/completions", json=tiny_nucleus, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    assert health(url)["status"] == "ok"


@pytest.mark.model
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
    assert old["choices"][0]["finish_reason"] == "length", old  # a value OpenAI clients know
    assert old["dyncomplete"]["stopped_by"] == "superseded" and old["dyncomplete"]["new_tokens"] < 256


@pytest.mark.model
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


@pytest.mark.model
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
            return await http.post(f"{url}/v1/completions", content=b, headers={"Content-Type": "application/json"})
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


@pytest.mark.model
def test_metrics_count_a_completion_in_prometheus_form(served):
    url, _ = served
    wait_idle(url)

    def samples() -> dict[str, float]:
        r = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        lines = r.text.splitlines()
        kinds = {line.split()[2]: line.split()[3] for line in lines if line.startswith("# TYPE ")}
        values = {line.split()[0]: float(line.split()[1]) for line in lines if not line.startswith("#")}
        assert set(kinds) == set(values) and {kinds[n] for n in kinds if n.endswith("_total")} == {"counter"}
        return values

    before = samples()
    r = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=120,
                   json={"model": MODEL, "prompt": "import sys\n", "max_tokens": 3, "temperature": 0})
    after = samples()
    assert after["dyncomplete_tokens_generated_total"] - before["dyncomplete_tokens_generated_total"] == \
        r.json()["usage"]["completion_tokens"]
    assert after["dyncomplete_prefix_cache_lookups_total"] == before["dyncomplete_prefix_cache_lookups_total"] + 1
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401  # behind the key, as every route


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.model
def test_methods_come_only_from_the_allow_list(served):
    """A request picks among the methods built at start: naming a draft model or a heads file
    loads and reads nothing, and a path that exists is refused in the same words as one that
    does not (no file-existence oracle)."""
    url, proc = served
    wait_idle(url)
    models = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]
    assert models["methods"] == ["baseline", "lookup"] and health(url)["methods"] == ["baseline", "lookup"]
    rss = rss_mb(proc.pid)
    refusals = {}
    for method in ["draft-model:smollm2-135m/4", "hf-generate:assisted:smollm2-135m", "lookup+stop:0.5",
                   "early-exit:confidence/heads=/etc/passwd@0.9", "early-exit:confidence/heads=/no/such/file@0.9"]:
        r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x", "method": method}, headers=AUTH,
                       timeout=60)
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "method_not_allowed" and error["param"] == "method", r.text
        assert "this server allows: baseline, lookup" in error["message"]
        refusals[method] = error["message"].replace(method, "NAME")
    assert refusals["early-exit:confidence/heads=/etc/passwd@0.9"] == refusals[
        "early-exit:confidence/heads=/no/such/file@0.9"]
    assert rss_mb(proc.pid) - rss < 50  # no second model copy
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 2,
                                                  "method": "lookup"}, headers=AUTH, timeout=120)
    assert r.status_code == 200 and r.json()["dyncomplete"]["method"] == "lookup"


@pytest.mark.model
def test_huge_prompt_is_cut_by_characters_before_tokenising(served):
    """A 1.9 MB prompt (under the 2 MiB body cap) is cut to a multiple of the 256-token budget by
    characters: answered at once, without the hundreds of MiB that tokenising it whole took."""
    url, proc = served
    wait_idle(url)
    lines = [f"    value_{i} = compute(value_{i - 1}, {i})  # step {i}\n" for i in range(1, 40_000)]
    prompt = "def long():\n" + "".join(lines)
    prompt = prompt[-1_900_000:]
    rss = rss_mb(proc.pid)
    started = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}, headers=AUTH,
                   timeout=120)
    elapsed = time.monotonic() - started
    assert r.status_code == 200, r.text
    stats = r.json()["dyncomplete"]
    assert stats["truncated_prompt"] and 128 <= stats["prompt_tokens"] <= 256, stats
    assert elapsed < 3.0, elapsed
    assert rss_mb(proc.pid) - rss < 100


@pytest.mark.model
def test_host_content_type_and_cors(served):
    """DNS rebinding and cross-site requests: a loopback server answers only loopback Host names,
    takes only JSON bodies and sends no CORS headers."""
    url, _ = served
    port = url.rsplit(":", 1)[1]
    body = json.dumps({"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 1})
    for host in ["evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", f"localhost:{port}x"]:
        for path in ["/health", "/", "/v1/models"]:
            r = httpx.get(f"{url}{path}", headers={**AUTH, "Host": host})
            assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (host, r.text)
    for host in [f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"]:
        assert httpx.get(f"{url}/health", headers={**AUTH, "Host": host}).status_code == 200, host
    for ctype in ["text/plain", "application/x-www-form-urlencoded", None]:
        headers = {**AUTH, **({"Content-Type": ctype} if ctype else {})}
        r = httpx.post(f"{url}/v1/completions", content=body, headers=headers, timeout=60)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (ctype, r.text)
    r = httpx.post(f"{url}/v1/completions", content=body, timeout=120,
                   headers={**AUTH, "Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200
    preflight = httpx.options(f"{url}/v1/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    got = httpx.get(f"{url}/health", headers={**AUTH, "Origin": "https://evil.example"})
    for r in (preflight, got):
        assert not [k for k in r.headers if k.lower().startswith("access-control-")], r.headers


def test_host_check_only_on_loopback():
    from dyncomplete.serve.http import Guard, Limits, host_allowed, is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.5", "example.org"]))
    assert all(map(host_allowed, ["localhost", "localhost:8000", "127.0.0.1:1", "[::1]", "[::1]:8000"]))
    assert not any(map(host_allowed, ["", "evil.example", "localhost.evil.example", "127.0.0.1:", "::1", "[::1]x"]))
    scope = {"type": "http", "headers": [(b"host", b"evil.example")]}
    assert Guard(None, Limits(), check_host=True).refusal(scope).status == 403
    assert Guard(None, Limits(), check_host=False).refusal(scope) is None  # bound elsewhere: any Host


def http_response(sock, timeout=15.0) -> tuple[int | None, dict | None]:
    """(status, JSON body) of the first response on a raw socket; (None, None) when the server
    closed it without a word."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            head, sep, body = data.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if sep and length and len(body) >= length[0]:
                break
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    if not data:
        return None, None
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.model
def test_request_heads_are_bounded(served):
    """A 1 MB header, 2,000 headers or 150 small ones: 431 in JSON, and the server keeps serving."""
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    heads = {
        "1 MB header": b"X-Big: " + b"a" * 2**20 + b"\r\n",
        "2000 headers": b"".join(b"X-H%d: v\r\n" % i for i in range(2000)),
        "150 headers": b"".join(b"X-H%d: v\r\n" % i for i in range(150)),
    }
    for name, extra in heads.items():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + SERVE_KEY.encode() + \
                b"\r\n" + extra + b"\r\n"
            try:
                for i in range(0, len(request), 8192):  # stop sending once the server has answered
                    if select.select([sock], [], [], 0)[0]:
                        break
                    sock.sendall(request[i:i + 8192])
            except (BrokenPipeError, ConnectionResetError):
                pass
            status, body = http_response(sock)
        assert status == 431 and body["error"]["code"] == "headers_too_large", (name, status, body)
    with socket.create_connection(("127.0.0.1", port)) as sock:  # not HTTP at all: a JSON 400 too
        sock.sendall(b"GARBAGE\r\n\r\n")
        status, body = http_response(sock)
    assert status == 400 and body["error"]["code"] == "bad_http", (status, body)
    assert health(url)["status"] == "ok"


@pytest.mark.model
def test_slow_clients_are_cut_off(served):
    """Slowloris: 200 connections that trickle a request head, one that trickles a body and one
    idle keep-alive connection are all closed within a few seconds (the head gets 5 s, the body 10 s,
    an idle connection 5 s), while the server keeps answering others."""
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    started = time.monotonic()
    loris = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    for sock in loris:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    slow_body = socket.create_connection(("127.0.0.1", port))
    slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + SERVE_KEY.encode()
                      + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
    idle = socket.create_connection(("127.0.0.1", port))
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + SERVE_KEY.encode()
                 + b"\r\n\r\n")
    assert idle.recv(65536).startswith(b"HTTP/1.1 200")
    closed: dict[socket.socket, float] = {}
    answers: dict[socket.socket, bytes] = {}
    open_socks = [*loris, slow_body, idle]
    assert health(url)["status"] == "ok"  # 202 slow connections do not stop the others
    while open_socks and time.monotonic() - started < 20:
        readable, _, _ = select.select(open_socks, [], [], 0.5)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            answers[sock] = answers.get(sock, b"") + data
            if not data:
                closed[sock] = time.monotonic() - started
                open_socks.remove(sock)
        for sock in loris:  # one more header line now and then, never the end of the head
            if sock in open_socks and int(time.monotonic() - started) % 2 == 0:
                try:
                    sock.send(b"X-A: b\r\n")
                except OSError:
                    pass
    try:
        assert not open_socks, f"{len(open_socks)} slow connections still open after 20 s"
        assert max(closed[s] for s in loris) < 9, max(closed.values())
        assert all(answers[s].startswith(b"HTTP/1.1 408") and b"request_timeout" in answers[s] for s in loris)
        assert 9 < closed[slow_body] < 15 and answers[slow_body].startswith(b"HTTP/1.1 408"), answers[slow_body]
        assert b'"code":"request_timeout"' in answers[slow_body]
        assert closed[idle] < 9
    finally:
        for sock in [*loris, slow_body, idle]:
            sock.close()
    assert health(url)["status"] == "ok"


@pytest.mark.model
def test_connection_cap_answers_503_in_json(served):
    """Beyond 256 open connections a new one gets a JSON 503 at once and is closed."""
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(262)]
    try:
        time.sleep(1)  # the server has taken them all in (a head gets 5 s: the first 256 stay open)
        readable, _, _ = select.select(socks, [], [], 0)
        refused = [http_response(sock, timeout=2) for sock in readable]
        assert len(refused) >= 6, len(refused)
        assert all(s == 503 and b["error"]["code"] == "too_many_connections" for s, b in refused), refused
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.3)
    assert health(url)["status"] == "ok"


@pytest.mark.model
def test_supersede_only_within_one_client(served):
    """A request with the same X-Client-Id from another address (or claiming one through
    X-Forwarded-For) does not stop the first one: ids are scoped to what the server can verify."""
    url, _ = served
    wait_idle(url)
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 64, "stream": False}
    results = {}

    def first():
        results["first"] = httpx.post(f"{url}/v1/completions", json=body, timeout=120,
                                      headers={**AUTH, "X-Client-Id": "editor-7"}).json()

    thread = threading.Thread(target=first)
    thread.start()
    while not health(url)["worker"]["busy"]:
        time.sleep(0.02)

    def from_elsewhere(extra):  # another address, the same id
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=120) as other:
            return other.post(f"{url}/v1/completions", json={**body, "max_tokens": 1},
                              headers={**AUTH, "X-Client-Id": "editor-7", **extra})

    with ThreadPoolExecutor(2) as pool:
        queued = pool.submit(from_elsewhere, {})
        while not health(url)["worker"]["queued"] and not queued.done():
            time.sleep(0.02)
        claiming = pool.submit(from_elsewhere, {"X-Forwarded-For": "127.0.0.1"})
        queued, claiming = queued.result(), claiming.result()
    thread.join()
    # the address is the peer's, whatever X-Forwarded-For says: the second request from 127.0.0.2
    # superseded the first from there, and neither touched the one from 127.0.0.1
    assert queued.status_code == 409 and queued.json()["error"]["code"] == "superseded", queued.text
    assert claiming.status_code == 200 and claiming.json()["dyncomplete"]["queue_s"] > 0.05, claiming.text
    assert results["first"]["dyncomplete"]["stopped_by"] != "superseded", results["first"]
    assert results["first"]["choices"][0]["finish_reason"] in ("stop", "length")


def test_finish_reasons_are_ones_openai_clients_know():
    from dyncomplete.serve.report import finish_reason

    for stopped_by in ["max_tokens", "timeout", "superseded", "disconnected", "shutdown", "cancelled"]:
        assert finish_reason(stopped_by) == "length"
    for stopped_by in ["eos", "newline", "stop", "stop_rule"]:
        assert finish_reason(stopped_by) == "stop"


@pytest.mark.model
def test_unexpected_errors_are_json_without_paths(smollm):
    """A failure no handler expected is a JSON 500 that names no file."""
    from starlette.testclient import TestClient

    from dyncomplete.serve import Settings, create_app

    app = create_app(smollm, Settings(methods=(), cache_bytes=0))

    @app.get("/boom")
    async def boom():
        raise OSError(2, "No such file or directory", "/secret/path/heads.pt")

    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as http:
        r = http.get("/boom")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert "/secret" not in r.text
