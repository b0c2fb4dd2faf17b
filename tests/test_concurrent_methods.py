"""One method object serves concurrent requests (issue 15, item 12). The server's worker keeps
built methods and reuses them; each request's state (a proposer's index, shortlist, draft cache
and acceptance statistics, an exit policy's state, the stop rule's LM-head rows) lives with the
request, so two threads on one object give what serial calls give, and nothing one request saw
reaches the next."""

import threading

import pytest
import torch

from dyncomplete.engine import GenerationParams
from dyncomplete.methods import make_method

pytestmark = pytest.mark.model

PROMPTS = [
    "total = add(a, b)\nprint(total)\nresult = add(a, c)\nprint(",
    "def area(r):\n    return 3.14 * r * r\n\n\ndef perimeter(r):\n    return",
]
TIMING = {"prefill_s", "decode_s", "total_s", "tokens_per_s"}


def figures(completion) -> tuple:
    """Tokens and every work figure of a completion (timings aside)."""
    stats = {k: v for k, v in completion.stats.to_dict().items() if k not in TIMING}
    return completion.token_ids, stats


@pytest.fixture
def one_thread_per_call():
    """Two calls at once on two cores: one thread each (the serial calls too, for the same sums)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["lookup", "self-spec", "self-spec:dynamic@0.7", "lookup+self",
                                  "early-exit:saturation@0.99", "lookup+stop:1.0"])
def test_two_threads_on_one_method_object_match_serial_calls(smollm, one_thread_per_call, name):
    ids = [smollm.tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]
    params = GenerationParams(max_new_tokens=12)
    method = make_method(name, smollm)
    serial = [figures(method.generate(smollm, i, params)) for i in ids]
    # the same object again: the first prompt gives the same figures after the second ran
    assert figures(method.generate(smollm, ids[0], params)) == serial[0]

    results, errors = [None, None], []
    start = threading.Barrier(2)

    def run(k):
        try:
            start.wait()
            results[k] = figures(method.generate(smollm, ids[k], params))
        except Exception as exc:  # reported below, with the thread's name
            errors.append((k, exc))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == serial
    assert smollm.head_tap is None
