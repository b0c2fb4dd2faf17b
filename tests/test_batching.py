"""Continuous batching (int4, decode.c): several sequences' rows in one call give each sequence the
bits it gets alone, and a worker with parallel slots gives every request baseline's tokens alone,
whatever shares its batches (prompts in chunks, other requests joining and leaving, a cancelled
one, a method that runs alone)."""

import time

import pytest
import torch
from helpers import ids_of, run_jobs, stdlib_prompts

from dyncomplete.engine import GenerationParams
from dyncomplete.serve.batching import ModelThread
from dyncomplete.serve.prefix_cache import PrefixCache
from dyncomplete.serve.worker import Job, Worker

pytestmark = pytest.mark.model


def greedy_alone(model, ids, steps):
    cache = model.new_cache()
    out = [model.forward(torch.tensor(ids), cache)[0, -1]]
    for _ in range(steps):
        out.append(model.forward(torch.tensor([int(out[-1].argmax())]), cache)[0, -1])
    return out


def test_batched_rows_are_each_sequences_own_bits(smollm_int4):
    prompts = [ids_of(smollm_int4, p) for p in stdlib_prompts(3, 40)]
    alone = [greedy_alone(smollm_int4, ids, 5) for ids in prompts]
    caches = [smollm_int4.new_cache() for _ in prompts]
    done, logits = [0] * len(prompts), [[] for _ in prompts]
    # prompt chunks of 16 of every sequence together (different lengths: they end at different calls)
    while any(d < len(ids) for d, ids in zip(done, prompts)):
        steps, who = [], []
        for k, ids in enumerate(prompts):
            if done[k] < len(ids):
                chunk = ids[done[k] : done[k] + 16]
                assert smollm_int4.batchable(caches[k], done[k], len(chunk))
                steps.append((chunk, caches[k], done[k], done[k] + len(chunk) == len(ids)))
                who.append(k)
                done[k] += len(chunk)
        for k, row in zip(who, smollm_int4.forward_batch(steps)):
            if row is not None:
                logits[k].append(row)
    for _ in range(5):
        steps = [([int(logits[k][-1].argmax())], caches[k], done[k], True) for k in range(len(prompts))]
        for k, row in enumerate(smollm_int4.forward_batch(steps)):
            logits[k].append(row)
            done[k] += 1
    for mine, theirs in zip(logits, alone):
        assert len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_a_cache_behind_the_step_is_not_batchable(smollm_int4):
    cache = smollm_int4.new_cache()
    smollm_int4.forward(torch.tensor(ids_of(smollm_int4, "x = 1\n")), cache)
    assert not smollm_int4.batchable(cache, cache.lengths[0] + 1, 1)
    assert smollm_int4.batchable(cache, cache.lengths[0], 1)
    assert not smollm_int4.batchable(None, 0, 1)


def job(prefix, method="baseline", n=24):
    return Job(prefix=prefix, suffix=None, params=GenerationParams(max_new_tokens=n), method=method, use_cache=True,
               client_id=None, editor="", deadline=time.perf_counter() + 600, emit=lambda e: None)


def worker_of(model, parallel):
    w = Worker(model, ["baseline", "lookup"], queue_size=16, context_budget=512, prefix_cache=PrefixCache(2**27),
               parallel=parallel)
    w.start()
    return w


def completions(worker, prefixes, methods, cancel_after=None):
    finals = run_jobs(worker, [job(p, m) for p, m in zip(prefixes, methods)], cancel_after)
    assert all(kind == "done" for kind, _ in finals), finals
    return [result["completion"] for _, result in finals]


@pytest.fixture(scope="module")
def prefixes():
    return stdlib_prompts(6, 600)


@pytest.fixture(scope="module")
def alone(smollm_int4, prefixes):
    w = worker_of(smollm_int4, 1)
    try:
        return completions(w, prefixes, ["baseline"] * len(prefixes))
    finally:
        w.stop()


def test_parallel_slots_give_each_request_its_tokens_alone(smollm_int4, prefixes, alone):
    w = worker_of(smollm_int4, 4)
    try:
        together = completions(w, prefixes, ["baseline"] * len(prefixes))
        status = w.status()["batching"]
    finally:
        w.stop()
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert max(status["batch_sizes"]) > 1  # the requests did share calls
    assert status["in_generation"] == 0


def test_a_cancelled_request_and_one_that_runs_alone_change_no_other(smollm_int4, prefixes, alone):
    w = worker_of(smollm_int4, 3)
    methods = ["baseline", "lookup", "baseline", "baseline", "baseline", "baseline"]
    try:
        finals = run_jobs(w, [job(p, m) for p, m in zip(prefixes, methods)], cancel_after={2: 3})
    finally:
        w.stop()
    results = [result["completion"] for _, result in finals]
    assert finals[2][1]["stats"]["stopped_by"] == "disconnected" and results[2].stats.new_tokens < 24
    for k in (0, 1, 3, 4, 5):  # lookup is lossless: baseline's tokens too
        assert results[k].token_ids == alone[k].token_ids


def test_a_failing_step_reaches_its_slot_and_the_thread_goes_on(smollm_int4):
    thread = ModelThread(smollm_int4)
    thread.start()
    try:
        with pytest.raises(ValueError, match="boom"):
            thread.run_alone(lambda: (_ for _ in ()).throw(ValueError("boom")))
        cache = smollm_int4.new_cache()
        logits = thread.forward(0, ids_of(smollm_int4, "import os\n"), cache, 0)
        assert torch.equal(logits, smollm_int4.forward(torch.tensor(ids_of(smollm_int4, "import os\n")), smollm_int4.new_cache())[0, -1])
    finally:
        thread.stop()
