"""The model worker without HTTP: a deadline stops a generation (tokenising included), a job
cancelled while queued never reaches the model, methods are built at start and a method outside
them is refused without stopping the thread, and an exact method never reuses an early exit's
shallow prompt."""

import time

import pytest
from helpers import products_here_and_on_a_later_thread, run_jobs

from dyncomplete.engine import GenerationParams
from dyncomplete.serve.prefix_cache import PrefixCache
from dyncomplete.serve.report import finish_reason
from dyncomplete.serve.worker import Busy, Job, Worker

pytestmark = pytest.mark.model


def job(prompt="def f(x):\n", n=64, method="baseline", deadline_s=300.0, client=None):
    return Job(prefix=prompt, suffix=None, params=GenerationParams(max_new_tokens=n), method=method, use_cache=True,
               client_id=client, editor="", deadline=time.perf_counter() + deadline_s, emit=lambda e: None)


@pytest.fixture(scope="module")
def worker(smollm):
    w = Worker(smollm, ["baseline"], queue_size=3, context_budget=256, prefix_cache=PrefixCache(2**26))
    w.start()
    yield w
    w.stop()


def test_deadline_stops_the_generation(worker):
    (kind, result), = run_jobs(worker, [job(deadline_s=0.5)])
    assert kind == "done" and result["stats"]["stopped_by"] == "timeout"
    assert finish_reason("timeout") == "length"  # cut short by a limit, as OpenAI clients know it
    assert result["completion"].stats.new_tokens < 64


class SlowTokenizer:
    """The model's tokenizer, 0.3 s slower a call: tokenising that outlasts the deadline."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, *args, **kwargs):
        time.sleep(0.3)
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


class SlowTokenizingModel:
    def __init__(self, model):
        self._model, self.tokenizer = model, SlowTokenizer(model.tokenizer)

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_tokenising_counts_against_the_deadline(smollm):
    w = Worker(SlowTokenizingModel(smollm), ["baseline"], queue_size=2, context_budget=256,
               prefix_cache=PrefixCache(0))
    w.start()
    try:
        (kind, error), = run_jobs(w, [job(deadline_s=0.2)])
    finally:
        w.stop()
    assert kind == "error" and error.status == 503 and error.code == "timeout", (kind, error)
    assert w.status()["skipped_timeout"] == 1


def test_methods_are_built_at_start(smollm):
    with pytest.raises(ValueError, match="cannot serve method 'baseline:3'"):
        Worker(smollm, ["baseline", "baseline:3"], queue_size=1, context_budget=256, prefix_cache=PrefixCache(0))


def test_cancelled_in_queue_and_bad_method(worker):
    first, queued, bad = job(n=3), job(n=3), job(n=3, method="baseline:nonsense")
    queued.cancel("superseded")
    results = run_jobs(worker, [first, queued, bad])
    assert results[0][0] == "done"
    assert results[1][0] == "error" and results[1][1].status == 409 and results[1][1].code == "superseded"
    assert results[2][0] == "error" and results[2][1].status == 400 and "not allowed" in results[2][1].message
    assert worker.status()["skipped_superseded"] == 1


def test_queue_bound_and_supersede(worker):
    hold = job(n=200, client="c")
    worker.submit(hold)
    while not worker.running(hold):
        time.sleep(0.01)
    newer = job(n=2, client="c")
    worker.submit(newer)  # the same client: the running generation is superseded
    assert hold.cancelled() and hold.reason == "superseded"
    accepted = 1
    with pytest.raises(Busy):
        for _ in range(10):
            worker.submit(job(n=1))
            accepted += 1
    assert accepted <= 3 + 1  # the queue's bound (plus one the worker may have taken meanwhile)
    while worker.status()["busy"] or worker.status()["queued"]:
        time.sleep(0.05)
    assert worker.status()["stopped_superseded"] >= 1


def test_building_the_methods_leaves_the_decoding_thread_at_full_speed(smollm):
    """The worker builds its methods in the starting thread, and an exit method's build runs
    tensor work there (heads, shortlists), which keeps that thread's OpenMP pool alive; the worker
    then frees it, as `load` does (kept, the served exit at layer 22 of the tuned Qwen decoded at
    14.7 ms a token instead of 9.4)."""
    here, there = products_here_and_on_a_later_thread(
        lambda: Worker(smollm, ["baseline", "early-exit:static/kv=propagate/emit=short@28"], queue_size=1,
                       context_budget=256, prefix_cache=PrefixCache(0)))
    assert there < 1.5 * here, (here, there)


def test_a_shallow_prompt_is_never_reused_by_an_exact_method(smollm):
    """`prompt=L` leaves projected keys above L in the prompt's cache: the prefix cache keeps it
    for requests of that method, and `baseline` prefills the same prompt again."""
    shallow = "early-exit:static/kv=propagate/prompt=20@20"
    w = Worker(smollm, ["baseline", shallow], queue_size=4, context_budget=256, prefix_cache=PrefixCache(2**26))
    w.start()
    try:
        prompt = "import os\n\n\ndef list_files(path):\n    names = []\n    for"
        results = [r for _, r in run_jobs(w, [job(prompt, 8, shallow), job(prompt, 8), job(prompt, 8, shallow),
                                              job(prompt, 8)])]
    finally:
        w.stop()
    cached = [r["completion"].stats.cached_prompt_tokens for r in results]
    assert cached[0] == cached[1] == 0 and cached[2] > 0 and cached[3] > 0, cached
    assert results[1]["completion"].token_ids == results[3]["completion"].token_ids
