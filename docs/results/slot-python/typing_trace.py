"""python docs/results/slot-python/typing_trace.py [LINE]: one llama.vim-shaped editor typing three lines of click's core.py (from LINE, default 400), a request per keystroke (waiting for
each answer), against a server on :8931; per request: prompt_n, prompt_ms, predicted_n,
predicted_ms, latency."""
import json, sys, time, httpx
S = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
lines = open(S + "click/core.py").read().split("\n")
body = json.load(open("tests/editor_bodies/llama_vim_infill.json"))
body.pop("input_extra", None)
y0 = int(sys.argv[1]) if len(sys.argv) > 1 else 400
http = httpx.Client(timeout=60)
for y in range(y0, y0 + 3):
    line = lines[y]; indent = len(line) - len(line.lstrip())
    for k in range(indent, len(line) + 1, 2):
        prefix = "\n".join(lines[max(0, y - 256):y]) + "\n"
        suffix = line[k:] + "\n" + "\n".join(lines[y + 1:y + 65])
        b = body | {"input_prefix": prefix, "input_suffix": suffix, "prompt": line[:k],
                    "response_fields": body["response_fields"] + ["tokens_evaluated"]}
        t = time.perf_counter(); r = http.post("http://127.0.0.1:8931/infill", json=b).json(); dt = time.perf_counter() - t
        print(f"y {y} k {k:3}: evaluated {r['timings/prompt_n']:4} of {r['tokens_evaluated']:5}, prompt {r['timings/prompt_ms']:6.1f} ms, "
              f"generated {r['timings/predicted_n']:3} in {r['timings/predicted_ms']:6.1f} ms, latency {1000*dt:6.1f} ms  {r['content'][:30]!r}")
