"""python docs/results/slot-python/healing_probe.py: ms to plan token healing (Qwen 0.5B's
vocabulary) for prompts ending in a space, a dot after an indentation and an indentation: the
first plan of each ending, then the median of 100 more."""
import statistics, time
from dyncomplete.engine import healing
from dyncomplete.models import load

tok = load("qwen2.5-coder-0.5b", quant="auto", progress=lambda m: None).tokenizer
healing.sorted_token_texts(tok)  # the server sorts the vocabulary once at start
for text in ["x = ", "        self.", "def f(x):\n    "]:
    ids = tok(text, add_special_tokens=False).input_ids
    t = time.perf_counter(); heal = healing.plan(tok, ids); first = 1000 * (time.perf_counter() - t)
    times = []
    for _ in range(100):
        t = time.perf_counter(); healing.plan(tok, ids); times.append(1000 * (time.perf_counter() - t))
    print(f"{text!r:22} allowed {len(heal.allowed):6}: first {first:6.2f} ms, then median {statistics.median(times):6.3f} ms")
